"""Private files (mode 0600): a secret made once (Django's SECRET_KEY under ``var/``,
the embedded Spark cluster's ``spark.authenticate`` secret, the Redis password ``up``
sets), and the runner's config files."""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path


def make_once(path: Path, make: Callable[[], str]) -> str:
    """The secret in ``path``, made by ``make()`` if the file does not exist yet. Written
    whole to a private temporary file, then linked into place: processes starting
    together all read the one that won, never a half-written file."""
    if not path.exists():
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(make())
        try:
            os.link(tmp, path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    return path.read_text().strip()


def write_private(path: Path, text: str) -> None:
    """``text`` into ``path``, readable by this user only (whatever the umask)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
