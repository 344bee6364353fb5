"""`fuel pull OWNER/REPO[:QUANT]`'s progress: huggingface_hub's download drawn on the demo's bar.

snapshot_download makes its progress bars from the `tqdm_class` it is given: one for the files and,
in huggingface_hub 1.x and later, two for the bytes of all files together, those written to disk and
those received ("Downloading bytes", which xet's deduplication makes differ). The bytes written,
the ones a demo's bar counts too, move the bar; the others only keep tqdm's interface.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager

from .demo import progress_bar

_RECEIVED = "Downloading bytes"


@contextmanager
def hub_progress(name: str, enabled: bool = True):
    """A tqdm class for snapshot_download(tqdm_class=...), drawing on one bar named `name`."""
    bar = progress_bar(enabled)
    with bar:
        task = bar.add_task(name, total=None)

        class Bytes:
            _lock = threading.RLock()

            def __init__(self, *args, total=None, initial=0, desc="", unit="it", **kwargs):
                self.drawn = unit == "B" and not str(desc).startswith(_RECEIVED)
                self._total, self.n, self.desc = None, 0, desc
                self.total = total
                self.update(initial)

            @property
            def total(self):
                return self._total

            @total.setter
            def total(self, value):
                self._total = value
                if self.drawn and value:
                    bar.update(task, total=value)

            def update(self, n=1):
                self.n += n or 0
                if self.drawn and n:
                    bar.advance(task, n)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                self.close()

            def close(self):
                pass

            def refresh(self, *args, **kwargs):
                pass

            def set_description(self, desc=None, refresh=True):
                pass

            set_description_str = set_postfix_str = set_transfer_postfix_str = set_description

            def update_transfer(self, n=1):
                pass

            @property
            def format_dict(self):
                return {"rate": None}

            @classmethod
            def get_lock(cls):
                return cls._lock

            @classmethod
            def set_lock(cls, lock):
                cls._lock = lock

        yield Bytes
