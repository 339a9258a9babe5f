"""The quick-start demo (``make demo``): a worked privacy calculation.

Replaced by a real private generation once the engine lands.
"""

from dplang.cli.app import main

if __name__ == "__main__":
    raise SystemExit(
        main(["account", "--epsilon", "10", "--delta", "1e-6", "--tokens", "64",
              "--batch-size", "7", "--temperature", "1.2"])
    )
