"""Signing: canonical encoding, the checkpoint envelope, each call record, the run's identity.

Invariants:
- Encoding is canonical JSON (sorted keys, no spaces, UTF-8). Nothing is ever pickled.
- The MAC covers a header built from every field the store keeps in clear (run id, step or
  segment and sequence number, flow, status, time) followed by the payload. A genuine row
  copied to another run, step or position therefore fails the check.
- A row is checked before its payload is parsed: `open_checkpoint` and `open_call` run
  `json.loads` only on bytes whose MAC matched.
- Key rotation: the first key signs, every key verifies; each row names its key by id.
- A principal (a credential) is never stored: only an HMAC of it, which proves a later ctx
  carries the same one.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import hashlib
import hmac
import json
import math
import sys
from collections.abc import Sequence
from json.encoder import encode_basestring as _json_str
from typing import Any

from agentflow._errors import CheckpointStoreCorrupt, UnstorableValue
from agentflow.exec.checkpoints.records import SealedCall, SealedCheckpoint, SealedEvent

#: The shortest key accepted, in bytes (HMAC-SHA256's block of output).
MIN_KEY_BYTES = 32

_CHECKPOINT_DOMAIN = "agentflow/checkpoint/1"
_CALL_DOMAIN = "agentflow/call/1"
_PRINCIPAL_DOMAIN = b"agentflow/principal/1\n"
_REQUEST_DOMAIN = "agentflow/request/1"
_EVENT_DOMAIN = "agentflow/event/1"


#: One encoder for every canonical encoding (building one per call costs as much as encoding).
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
#: How deeply JSON given from outside (an operator's result or patch) may nest (`loads_storable`).
MAX_DEPTH = 200
#: The integer digits `loads_storable` takes where Python sets no limit of its own.
_NO_DIGIT_LIMIT = 1_000_000
#: How deeply `unstorable` looks into a value: past that, the value nests deeper than JSON is written
#: (the encoder's recursion ends well before) or refers to itself.
_WALK_DEPTH = 10_000
_FIX = (
    "JSON-only storage cannot keep it; store valid text, finite numbers, shorter integers (or as text), flatter values"
)


def canonical(value: Any) -> bytes:
    """Encode a JSON-able value canonically (sorted keys, compact, UTF-8).

    Raises:
        TypeError: the value holds something JSON cannot carry.
        UnstorableValue: the value holds NaN or infinity, text that is not valid Unicode (a
            lone surrogate), an integer too long to write, nesting too deep, or a circular
            reference; the message names where (``state.text``).
    """
    try:
        return _ENCODER.encode(value).encode()
    except RecursionError:
        where: str | None = None
    except (UnicodeEncodeError, ValueError) as exc:
        where = unstorable(value)
        if where is None and "Circular reference" not in str(exc):
            raise
    raise UnstorableValue(
        f"{where}: {_FIX}" if where else "the value nests too deeply to write as JSON, or refers to itself"
    ) from None


def check_storable(value: Any, path: str) -> None:
    """Refuse a value holding a float JSON has no number for, before a JSON dump turns it into ``null``.

    pydantic's JSON-mode dump writes NaN and infinities it finds under ``Any`` (a ``dict`` of
    anything, say) as ``null``, silently: a state or a result would come back other than it
    was. `canonical` catches the rest (text that is not Unicode, floats the dump kept).

    Raises:
        UnstorableValue: `value` holds NaN or an infinity (the message names where, under `path`).
    """
    where = unstorable(value, path, text=False)
    if where is not None:
        raise UnstorableValue(f"{where}: JSON-only storage cannot keep it; store finite numbers")


def loads_storable(text: str, what: str) -> Any:
    """Decode JSON given from outside (an operator's result, a state patch) into what `canonical` stores.

    Args:
        text: the JSON document.
        what: names it in errors (``--patch``, ``the result of call c1``).

    Raises:
        json.JSONDecodeError: `text` is not JSON.
        UnstorableValue: it is JSON that cannot be stored: text that is not Unicode, NaN or
            an infinity, an integer of more digits than Python writes, nesting deeper than
            `MAX_DEPTH`; the message says where and what to change.
    """
    bad = _bad_text(text, what)
    if bad is not None:
        raise UnstorableValue(f"{bad}: pass valid UTF-8 text")
    try:
        value = strict_json(text, sys.get_int_max_str_digits() or _NO_DIGIT_LIMIT)
    except RecursionError:
        raise UnstorableValue(f"{what} nests deeper than {MAX_DEPTH} levels: pass a flatter value") from None
    except NumberRefused as exc:
        raise UnstorableValue(f"{what}: {exc}") from None
    where = unstorable(value, what, max_depth=MAX_DEPTH)
    if where is not None:
        raise UnstorableValue(f"{where}: {_FIX}")
    return value


class NumberRefused(ValueError):
    """Raised from inside `strict_json` for a number it does not take (the message says which)."""


def strict_json(text: str, max_int_digits: int) -> Any:
    """`json.loads`, refusing NaN, infinities, floats too large and integers longer than `max_int_digits` digits.

    Raises:
        json.JSONDecodeError: `text` is not JSON.
        NumberRefused: it holds a number refused here.
        RecursionError: it nests too deeply for the decoder.
    """
    return json.loads(
        text, parse_constant=_no_constant, parse_float=_finite, parse_int=functools.partial(_short_int, max_int_digits)
    )


def _no_constant(name: str) -> Any:
    raise NumberRefused(f"{name}, which JSON does not allow: write a finite number")


def _finite(text: str) -> float:
    number = float(text)
    if not math.isfinite(number):
        raise NumberRefused(f"a number too large for a float ({text[:20]}...): write it as a string")
    return number


def _short_int(limit: int, text: str) -> int:
    digits = len(text.lstrip("-"))
    if digits > limit:
        raise NumberRefused(f"an integer of {digits} digits (at most {limit} are accepted): write it as a string")
    return int(text)


def unstorable(value: Any, path: str = "", *, text: bool = True, max_depth: int = _WALK_DEPTH) -> str | None:
    """Say where in `value` lies the first thing JSON cannot keep.

    That is a non-finite float, an integer too long to write, (`text`) a lone surrogate,
    or nesting deeper than `max_depth` (a value that refers to itself nests without end).
    Walks dicts, lists, tuples and the fields of pydantic models and dataclasses, without
    recursion; a path is spelled out only for what it reports (``state.items[2]``).
    """
    stack: list[tuple[Any, _Trail, int]] = [(value, None, 0)]
    while stack:
        item, trail, depth = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return f"{_spelled(path, trail)} is {item!r}, which JSON has no number for"
        if isinstance(item, int) and not isinstance(item, bool) and _too_long(item):
            return f"{_spelled(path, trail)} is an integer of more than {sys.get_int_max_str_digits()} digits"
        if isinstance(item, str):
            bad = _bad_text(item, _spelled(path, trail)) if text and not _encodable(item) else None
            if bad is not None:
                return bad
            continue
        items = list(_items_of(item))
        if items and depth >= max_depth:
            return f"{path or 'the value'} nests deeper than {max_depth} levels (or refers to itself)"
        for key, child in reversed(items):
            if text and isinstance(key, str) and not _encodable(key):
                return _bad_text(key, f"a key of {_spelled(path, trail)}")
            stack.append((child, (key, trail), depth + 1))
    return None


_Trail = tuple[Any, "_Trail"] | None
"""Where a walk is: the key or index taken last, and the trail to its container (None: the top)."""


def _spelled(path: str, trail: _Trail) -> str:
    """The path of `trail` under `path`, as a reader writes it (``state.items[2]``; ``the value`` for the top)."""
    keys: list[Any] = []
    while trail is not None:
        key, trail = trail
        keys.append(key)
    at = path
    for key in reversed(keys):
        at = f"{at}[{key}]" if isinstance(key, int) else (f"{at}.{key}" if at else str(key))
    return at or "the value"


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _too_long(number: int) -> bool:
    """Whether `number` has more digits than Python writes as text (`sys.get_int_max_str_digits`)."""
    limit = sys.get_int_max_str_digits()
    if limit <= 0 or number.bit_length() <= 3 * limit:  # below 8**limit: fewer digits than the limit
        return False
    try:
        str(number)
    except ValueError:
        return True
    return False


def _bad_text(value: str, path: str) -> str | None:
    """Say where `value` (at `path`) holds a lone surrogate, or None if it is valid text."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        return f"{path or 'the value'} holds a lone surrogate ({value[exc.start]!r} at {exc.start})"
    return None


def _items_of(value: Any) -> Any:
    """The (key, item) pairs inside a container: a dict's, a list's or tuple's (by index), a model's fields."""
    if isinstance(value, dict):
        return value.items()
    if isinstance(value, list | tuple):
        return enumerate(value)
    if hasattr(type(value), "model_fields"):  # a pydantic model: its fields, as it iterates them
        return list(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [(f.name, getattr(value, f.name)) for f in dataclasses.fields(value)]
    return ()


def _header_bytes(header: str) -> bytes:
    """A header's bytes (UTF-8).

    Raises:
        UnstorableValue: a field of it (a run id, a flow, a kind) holds a lone surrogate.
    """
    try:
        return header.encode()
    except UnicodeEncodeError:
        bad = _bad_text(header, "a run id, flow name or kind")
        raise UnstorableValue(f"{bad}: it is not text; use ids of valid UTF-8 text") from None


def digest(value: Any) -> str:
    """Return the SHA-256 (hex) of a value's canonical encoding."""
    return hashlib.sha256(canonical(value)).hexdigest()


def key_id(key: bytes) -> str:
    """Return the short public id of a key (never the key, never reversible)."""
    return hashlib.sha256(b"agentflow/kid\n" + key).hexdigest()[:12]


def _check_keys(keys: bytes | Sequence[bytes]) -> list[bytes]:
    listed = [keys] if isinstance(keys, bytes | bytearray) else list(keys)
    if not listed:
        raise ValueError("checkpoint_key: give at least one key (bytes of 32 or more)")
    out: list[bytes] = []
    for key in listed:
        if not isinstance(key, bytes | bytearray):
            raise TypeError(f"checkpoint_key: each key must be bytes, not {type(key).__name__}")
        if len(key) < MIN_KEY_BYTES:
            raise ValueError(
                f"checkpoint_key: a key of {len(key)} bytes is too short; use at least {MIN_KEY_BYTES} "
                "random bytes (e.g. secrets.token_bytes(32)), the same on every worker"
            )
        out.append(bytes(key))
    return out


class Sealer:
    """Signs and checks rows under a key ring (the first key signs, any key verifies)."""

    def __init__(self, keys: bytes | Sequence[bytes]) -> None:
        """Build a sealer.

        Args:
            keys: one key, or a list for rotation (newest first). Each at least 32 bytes.

        Raises:
            TypeError: a key is not bytes.
            ValueError: no key, or a key shorter than 32 bytes.
        """
        ring = _check_keys(keys)
        self._signing_key = ring[0]
        self._kid = key_id(ring[0])
        self._keys = {key_id(k): k for k in ring}
        # Keyed once; each row copies the keyed state instead of hashing the key again.
        self._keyed = {kid: hmac.new(k, digestmod=hashlib.sha256) for kid, k in self._keys.items()}

    @property
    def kid(self) -> str:
        """Id of the signing key."""
        return self._kid

    def _mac(self, kid: str, header: bytes, payload: bytes) -> str:
        mac = self._keyed[kid].copy()
        mac.update(header)
        mac.update(b"\n")
        mac.update(payload)
        return mac.hexdigest()

    def _verify(self, what: str, kid: str, sig: str, header: bytes, payload: bytes) -> None:
        if kid not in self._keyed:
            raise CheckpointStoreCorrupt(f"{what} is signed with key id {kid!r}, which this worker does not have")
        if not hmac.compare_digest(self._mac(kid, header, payload), sig):
            raise CheckpointStoreCorrupt(f"{what}: signature does not match (changed, moved or forged)")

    # -- checkpoints -------------------------------------------------------------------

    @staticmethod
    def _checkpoint_header(run_id: str, step: int, flow: str, status: str, segment: int, saved_at: float) -> bytes:
        # The canonical encoding of [domain, run_id, step, flow, status, segment, repr(saved_at)],
        # spelled out: a tenth of the encoder's time, byte for byte the same (tested).
        return _header_bytes(
            f'["{_CHECKPOINT_DOMAIN}",{_json_str(run_id)},{int(step)},{_json_str(flow)},'
            f"{_json_str(status)},{int(segment)},{_json_str(repr(saved_at))}]"
        )

    def seal_checkpoint(
        self, run_id: str, step: int, flow: str, status: str, segment: int, saved_at: float, body: dict[str, Any]
    ) -> SealedCheckpoint:
        """Encode and sign a checkpoint body."""
        return self.seal_encoded_checkpoint(run_id, step, flow, status, segment, saved_at, canonical(body))

    def seal_encoded_checkpoint(
        self, run_id: str, step: int, flow: str, status: str, segment: int, saved_at: float, payload: bytes
    ) -> SealedCheckpoint:
        """Sign a checkpoint body that is already canonical JSON."""
        header = self._checkpoint_header(run_id, step, flow, status, segment, saved_at)
        sig = self._mac(self._kid, header, payload)
        return SealedCheckpoint(run_id, step, flow, status, segment, saved_at, payload, self._kid, sig)

    def checkpoint_problem(self, row: SealedCheckpoint) -> str | None:
        """What is wrong with a checkpoint row of its own run (signature, body), or None when it checks."""
        try:
            self.open_checkpoint(row, row.run_id)
        except CheckpointStoreCorrupt as exc:
            return str(exc)
        return None

    def open_checkpoint(self, row: SealedCheckpoint, run_id: str) -> dict[str, Any]:
        """Check a checkpoint row, then decode its body.

        Raises:
            CheckpointStoreCorrupt: the row belongs to another run, its signature does not
                match, or its payload is not a JSON object.
        """
        what = f"checkpoint {row.step} of run {run_id!r}"
        if row.run_id != run_id:
            raise CheckpointStoreCorrupt(f"{what}: the store returned a row of run {row.run_id!r}")
        header = self._checkpoint_header(row.run_id, row.step, row.flow, row.status, row.segment, row.saved_at)
        self._verify(what, row.kid, row.sig, header, row.payload)
        return _decode(what, row.payload)

    # -- call records ------------------------------------------------------------------

    @staticmethod
    def _call_header(run_id: str, segment: int, seq: int, kind: str) -> bytes:
        # The canonical encoding of [domain, run_id, segment, seq, kind], spelled out (as above).
        return _header_bytes(f'["{_CALL_DOMAIN}",{_json_str(run_id)},{int(segment)},{int(seq)},{_json_str(kind)}]')

    def seal_call(self, run_id: str, segment: int, seq: int, kind: str, body: dict[str, Any]) -> SealedCall:
        """Encode and sign a call record body.

        Raises:
            TypeError, ValueError: the body holds something JSON cannot carry.
        """
        return self.seal_encoded_call(run_id, segment, seq, kind, canonical(body))

    def seal_encoded_call(
        self, run_id: str, segment: int, seq: int, kind: str, payload: bytes, *, durable: bool = False
    ) -> SealedCall:
        """Sign a call record whose body is already canonical JSON (`canonical`); `durable` is `SealedCall.durable`."""
        sig = self._mac(self._kid, self._call_header(run_id, segment, seq, kind), payload)
        return SealedCall(run_id, segment, seq, kind, payload, self._kid, sig, durable)

    def open_call(self, row: SealedCall, run_id: str) -> dict[str, Any]:
        """Check a call record, then decode its body.

        Raises:
            CheckpointStoreCorrupt: the record belongs to another run, or its signature does not match.
        """
        what = f"call record {row.segment}.{row.seq} of run {run_id!r}"
        header = self._call_header(row.run_id, row.segment, row.seq, row.kind)
        return self._open(what, "a record", row.run_id, run_id, row.kid, row.sig, header, row.payload)

    def _open(
        self, what: str, kind: str, row_run: str, run_id: str, kid: str, sig: str, header: bytes, payload: bytes
    ) -> dict[str, Any]:
        """Check that a row is the run's and that its signature matches, then decode its payload."""
        if row_run != run_id:
            raise CheckpointStoreCorrupt(f"{what}: the store returned {kind} of run {row_run!r}")
        self._verify(what, kid, sig, header, payload)
        return _decode(what, payload)

    # -- requests ----------------------------------------------------------------------

    @staticmethod
    def _request_header(run_id: str, kind: str) -> bytes:
        return _header_bytes(f'["{_REQUEST_DOMAIN}",{_json_str(run_id)},{_json_str(kind)}]')

    def seal_request(self, run_id: str, kind: str, body: dict[str, Any]) -> str:
        """Sign an operator's request about a run, kept outside its rows (a cancel request).

        Returns one line of text, ``<key id>.<mac>.<base64url of the canonical body>``; the
        MAC covers the run id, the kind and the encoded body, so a request cannot be moved
        to another run or read as another kind.
        """
        encoded = base64.urlsafe_b64encode(canonical(body))
        return f"{self._kid}.{self._mac(self._kid, self._request_header(run_id, kind), encoded)}.{encoded.decode()}"

    def open_request(self, text: str, run_id: str, kind: str) -> dict[str, Any]:
        """Check a request `seal_request` made for `run_id` and `kind`, then decode its body.

        Raises:
            CheckpointStoreCorrupt: the text is not a request, or its signature does not match.
        """
        what = f"the {kind} request for run {run_id!r}"
        kid, _, rest = text.partition(".")
        sig, _, encoded = rest.partition(".")
        if not kid or not sig or not encoded:
            raise CheckpointStoreCorrupt(f"{what} is not a signed request")
        self._verify(what, kid, sig, self._request_header(run_id, kind), encoded.encode())
        try:
            payload = base64.urlsafe_b64decode(encoded.encode())
        except ValueError:
            raise CheckpointStoreCorrupt(f"{what}: its body is not base64") from None
        return _decode(what, payload)

    # -- events ------------------------------------------------------------------------

    @staticmethod
    def _event_header(run_id: str) -> bytes:
        return _header_bytes(f'["{_EVENT_DOMAIN}",{_json_str(run_id)}]')

    def seal_event(self, run_id: str, body: dict[str, Any]) -> SealedEvent:
        """Encode and sign one event of a run's stream (``{"name", "at", "data"}``).

        Raises:
            TypeError, ValueError: the body holds something JSON cannot carry.
        """
        payload = canonical(body)
        return SealedEvent(run_id, payload, self._kid, self._mac(self._kid, self._event_header(run_id), payload))

    def open_event(self, row: SealedEvent, run_id: str) -> dict[str, Any]:
        """Check an event of the run's stream, then decode its body.

        Raises:
            CheckpointStoreCorrupt: the event belongs to another run, or its signature does not match.
        """
        what = f"an event of run {run_id!r}"
        return self._open(
            what, "an event", row.run_id, run_id, row.kid, row.sig, self._event_header(row.run_id), row.payload
        )

    # -- identity ----------------------------------------------------------------------

    def principal_proof(self, run_id: str, principal: str) -> str:
        """Return what is stored instead of a principal: an HMAC bound to the run."""
        msg = _PRINCIPAL_DOMAIN + _header_bytes(f"{run_id}\n{principal}")
        return f"{self._kid}:{hmac.new(self._signing_key, msg, hashlib.sha256).hexdigest()}"

    def principal_matches(self, run_id: str, proof: str, principal: str) -> bool:
        """Whether `principal` is the one `proof` was made from (under any key of the ring)."""
        kid, _, mac = proof.partition(":")
        key = self._keys.get(kid)
        if key is None:
            return False
        msg = _PRINCIPAL_DOMAIN + _header_bytes(f"{run_id}\n{principal}")
        return hmac.compare_digest(hmac.new(key, msg, hashlib.sha256).hexdigest(), mac)


def _decode(what: str, payload: bytes) -> dict[str, Any]:
    try:
        body = json.loads(payload)
    except ValueError as exc:
        raise CheckpointStoreCorrupt(f"{what}: payload is not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise CheckpointStoreCorrupt(f"{what}: payload is not a JSON object")
    return body
