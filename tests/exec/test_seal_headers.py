"""The signed headers are the canonical JSON of their fields, however they are built.

Rows signed by any version of agentflow must keep verifying, so the header bytes are
fixed: the canonical encoding of a list of the fields in clear. The sealer builds them
by string formatting for speed; these tests hold it to the canonical encoder.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from hypothesis import given
from hypothesis import strategies as st

from agentflow.exec.seal import _CALL_DOMAIN, _CHECKPOINT_DOMAIN, Sealer, canonical

texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
counts = st.integers(min_value=0, max_value=2**62)
times = st.floats(min_value=0, max_value=4e9, allow_nan=False)


@given(run_id=texts, segment=counts, seq=counts, kind=texts)
def test_call_header_is_the_canonical_encoding_of_its_fields(run_id: str, segment: int, seq: int, kind: str) -> None:
    assert Sealer._call_header(run_id, segment, seq, kind) == canonical([_CALL_DOMAIN, run_id, segment, seq, kind])


@given(run_id=texts, step=counts, flow=texts, status=texts, segment=counts, saved_at=times)
def test_checkpoint_header_is_the_canonical_encoding_of_its_fields(
    run_id: str, step: int, flow: str, status: str, segment: int, saved_at: float
) -> None:
    fields = [_CHECKPOINT_DOMAIN, run_id, step, flow, status, segment, repr(saved_at)]
    assert Sealer._checkpoint_header(run_id, step, flow, status, segment, saved_at) == canonical(fields)


def test_a_row_signed_over_the_canonical_header_still_verifies() -> None:
    # Given a call record signed the way the first version built headers (the encoder)
    key = secrets.token_bytes(32)
    sealer = Sealer(key)
    row = sealer.seal_call('run "1" é', 2, 3, "done", {"result": "ok"})
    old = hmac.new(key, canonical([_CALL_DOMAIN, row.run_id, 2, 3, "done"]) + b"\n" + row.payload, hashlib.sha256)
    # Then it carries the same signature, and opens
    assert row.sig == old.hexdigest()
    assert sealer.open_call(row, row.run_id) == {"result": "ok"}
