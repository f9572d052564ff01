"""gptzoo's shipped recipes, one model per TOML file (installed as ``gptzoo_recipes``)."""
