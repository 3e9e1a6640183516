"""The formats: one module each, which registers its row (`register_format`) when
imported. Every module of this folder is imported here, so a new format is one module
dropped in this folder: `tc.load(format=)`, `tc.save(format=)` and the messages listing
the formats read the registered rows (`_formats`).
"""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
