"""specpolicy-entropy: an example third-party specpolicy plugin (see README.md)."""
