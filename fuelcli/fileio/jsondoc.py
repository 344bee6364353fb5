"""The one reader of the JSON documents fuel reads: config.json, generation_config.json,
tokenizer_config.json, model.safetensors.index.json and every safetensors header.

Each must be UTF-8 JSON whose top level is an object. Whatever else Python's parser throws on
hostile input (a RecursionError for deep nesting, a ValueError for an integer of more than 4300
digits) becomes the same one-line error naming the file and what was expected.
"""

from __future__ import annotations

import json
import os

from ..errors import InputError
from .files import is_present, read_regular

MAX_BYTES = 256 << 20  # no real config or tokenizer file comes near (Llama 3's tokenizer.json: 9 MB)

_KIND = {list: "an array", str: "a string", int: "a number", float: "a number", bool: "true/false",
         type(None): "null"}


def kind(value) -> str:
    """How a JSON value reads in an error message."""
    return _KIND.get(type(value), type(value).__name__)


def parse_object(data: bytes | str, where: str, error=InputError) -> dict:
    """A JSON document whose top level must be an object; `where` names it in errors."""
    try:
        text = data.decode("utf-8") if isinstance(data, (bytes, bytearray, memoryview)) else data
    except UnicodeDecodeError as e:
        raise error(f"{where} is not valid JSON: not UTF-8 (byte {e.start})") from None
    try:
        value = json.loads(text)
    except RecursionError:
        raise error(f"{where} is not valid JSON fuel can read: it nests too deeply") from None
    except json.JSONDecodeError as e:
        raise error(f"{where} is not valid JSON: {e.msg} (line {e.lineno}, column {e.colno})") from None
    except ValueError as e:  # the int digit limit (CVE-2020-10735): an integer of > 4300 digits
        raise error(f"{where} is not valid JSON fuel can read: {str(e).split(':')[0]}") from None
    if not isinstance(value, dict):
        raise error(f"{where} is not a JSON object (it is {kind(value)})")
    return value


def read_object(path: str | os.PathLike, required: bool = True, error=InputError) -> dict | None:
    """The JSON object in the regular file `path`; None when it is absent and not required."""
    if not required and not is_present(path):
        return None
    return parse_object(read_regular(path, MAX_BYTES), str(path), error)
