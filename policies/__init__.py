"""Built-in length policies (one module each), registered through the plugin hooks."""
