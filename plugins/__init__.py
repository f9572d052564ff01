"""gptzoo's built-in component plugins (the folder plugins/, installed as ``gptzoo_plugins``): one plugin
module per kind (``norms.py``), which registers each component by reference to its code in the sibling
of the same name with a leading underscore (``_norms.py``)."""
