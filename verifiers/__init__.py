"""Built-in verifiers, registered through the plugin hooks."""
