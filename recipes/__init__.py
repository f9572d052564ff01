"""gptzoo's shipped recipes (the folder recipes/, installed as ``gptzoo_recipes``): one model per TOML
file here, the sweep specs under ``sweeps/``. Data only; gptzoo.recipe and gptzoo.sweep read them."""
