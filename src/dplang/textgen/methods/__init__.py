"""Private generation methods, one module each, known to the rest of dplang through the
registry (:mod:`dplang.textgen.methods.registry`).

* :mod:`~dplang.textgen.methods.invisibleink`: InvisibleInk (the product's method);
* :mod:`~dplang.textgen.methods.amin`: Amin et al. 2024 (baseline);
* :mod:`~dplang.textgen.methods.adapmixed`: AdaPMixED (baseline, data-dependent accounting);
* :mod:`~dplang.textgen.methods.augpe`: Aug-PE (baseline, a population method).

Each module holds its mechanism, its calibration and the frozen params object whose
``guarantee()`` is what a release of it satisfies, and registers a
:class:`~dplang.textgen.methods.registry.MethodSpec`. Adding a method is one new module and one
line in :data:`~dplang.textgen.methods.registry.BUILTIN_MODULES`.
"""

from .registry import (
    MethodInputs,
    MethodOption,
    MethodSpec,
    all_methods,
    get_method,
    method_names,
    register_method,
    unregister_method,
)

__all__ = [
    "MethodInputs",
    "MethodOption",
    "MethodSpec",
    "all_methods",
    "get_method",
    "method_names",
    "register_method",
    "unregister_method",
]
