"""Hydra configuration groups (mirroring the code packages)."""
