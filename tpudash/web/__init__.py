"""The dashboard in a browser: ``tpudash serve`` (textual-serve) and ``tpudash.colab.show()``."""
