"""`python -m rewardlab.commands [PATH]`: write the config reference (docs/config.md) to PATH, or print it."""

import sys
from pathlib import Path

from rewardlab.commands import config_classes
from rewardlab.config.reference import reference_markdown


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0].startswith("-")):
        print("usage: python -m rewardlab.commands [PATH]  (write the config reference to PATH, or print it)",
              file=sys.stderr)
        return 2
    text = reference_markdown(config_classes())
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
