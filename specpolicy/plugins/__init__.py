"""The extension API: pluggy hook specifications and ``PluginEntry``, what a plugin declares it
provides (``hookspecs``), and the plugin manager that registers the built-in policies, drafters,
verifiers and loggers exactly as it registers third-party packages and builds the registry of
their entries (``manager``)."""
