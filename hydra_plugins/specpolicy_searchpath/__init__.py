"""Hydra plugin discovery shim: Hydra imports every module of the ``hydra_plugins`` namespace
package and registers the plugin classes it finds; the class lives in specpolicy."""

from specpolicy.run.hydra_searchpath import SpecpolicySearchPathPlugin

__all__ = ["SpecpolicySearchPathPlugin"]
