"""gptzoo's built-in component plugins (installed as ``gptzoo.builtins``): one plugin module per kind
(``norms.py``), which registers each component by reference to its code in the sibling of the same
name with a leading underscore (``_norms.py``)."""
