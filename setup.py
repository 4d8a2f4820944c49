"""Map the three source roots onto one import package: sdk -> octavo, core -> octavo.core, plugins -> octavo.plugins."""

import os

from setuptools import setup

ROOTS = {"octavo": "sdk", "octavo.core": "core", "octavo.plugins": "plugins"}


def find_packages_under(import_root: str, folder: str) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if not d.startswith((".", "__"))]
        if "__init__.py" in filenames:
            rel = os.path.relpath(dirpath, folder)
            found.append(import_root if rel == "." else import_root + "." + rel.replace(os.sep, "."))
    return found


packages = [pkg for root, folder in ROOTS.items() for pkg in find_packages_under(root, folder)]
setup(packages=packages, package_dir=ROOTS)
