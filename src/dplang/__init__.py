"""dplang: differentially private language generation.

Every public function that touches private data returns its result together with a
:class:`dplang.privacy.Guarantee` describing what the release promises.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dplang")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
