"""The extension API: pluggy hook specifications (``hookspecs``) and the plugin manager that
registers the built-in policies, drafters, verifiers and loggers exactly as it registers
third-party packages (``manager``)."""
