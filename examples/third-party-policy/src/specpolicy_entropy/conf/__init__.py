"""Hydra config files of the plugin (``policy/entropy.yaml``), found via ``pkg://specpolicy_entropy.conf``."""
