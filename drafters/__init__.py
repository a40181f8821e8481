"""Built-in drafters (one module each), registered through the plugin hooks."""
