"""Modules the cell imports that this Python does not have (matplotlib,
tqdm, torchvision, wandb…): they import as stand-ins whose calls do
nothing, with a note that the numbers may differ, so the rest of the code
runs. Only the cell's own imports get one; a library's ImportError stays."""

import importlib.abc
import importlib.machinery
import sys

import vramlab_shim as vs


class Missing:
    """Any attribute, call or item of a module that is not here. Iterated,
    it goes over what it was called on (`tqdm(loader)`)."""

    def __init__(self, path, over=None):
        self._path, self._over = path, over

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(self._path + "." + name)

    def __call__(self, *a, **k):
        return Missing(self._path + "()", a[0] if a else None)

    def __iter__(self):
        try:
            return iter(self._over if self._over is not None else ())
        except TypeError:
            return iter(())

    def __len__(self):
        try:
            return len(self._over)
        except TypeError:
            return 0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __getitem__(self, key):
        return Missing("%s[%r]" % (self._path, key))

    def __repr__(self):
        return "<%s: not in vramlab>" % self._path


def _imported_by_the_cell():
    f = sys._getframe(2)
    while f is not None and f.f_code.co_filename.startswith("<frozen importlib"):
        f = f.f_back
    return f is not None and f.f_code.co_filename == vs.CELL


class _Module(type(sys)):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Missing(self.__name__ + "." + name)


class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: what no other finder found."""

    def find_spec(self, name, path=None, target=None):
        if not _imported_by_the_cell():
            return None
        vs.note("no `%s` here: its calls do nothing, and the numbers may differ from a GPU's "
                "where it allocates" % name.split(".")[0])
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _Module(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        pass


FINDER = Finder()


def install():
    if FINDER not in sys.meta_path:
        sys.meta_path.append(FINDER)
