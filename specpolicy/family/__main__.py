"""``python -m specpolicy.family``: run the family training pipeline (see :mod:`specpolicy.family.pipeline`)."""

import os

# Passive OpenMP waiting: on a shared 2-core machine, spinning threads thrash when another
# process holds a core (measured 4x slower); must be set before torch loads libgomp.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from specpolicy.family.pipeline import main  # noqa: E402

if __name__ == "__main__":
    main()
