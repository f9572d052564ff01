"""gptzoo's built-in component plugins, one module per kind (installed as ``gptzoo.builtins``)."""
