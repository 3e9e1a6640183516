"""The formats, one module each, registering its row when imported: every module of this
folder is imported here, so a new format is one module dropped in."""

import importlib
import pkgutil

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
