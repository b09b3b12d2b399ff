"""Contract facts live in dmq.proto only: one value and one spelling for servers and clients."""

from __future__ import annotations

import ast
import pathlib

import pytest

from dmq.proto import dmq_pb2 as pb
from dmq.proto import offset_markers
from dmq.proto.names import app_id_in, group_id_for
from dmq.proto.wire import FETCH_METHOD, PRODUCE_METHOD, frame_produce_request

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Names that are contract facts: defined in proto/, imported everywhere else.
FACTS = {"EARLIEST", "LATEST", "START_AT_LOG_START", "START_BY_TIMESTAMP", "group_id_for", "frame_produce_request",
         "frame_fetch_response", "BROKER_SERVICE"}


def _definitions(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    defined: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            defined.add(node.name)
        elif isinstance(node, ast.Assign):
            defined.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            defined.add(node.target.id)
    return defined


def test_no_contract_fact_is_defined_outside_proto():
    redefined = [
        f"{path.relative_to(ROOT)} defines {name}"
        for folder in ("broker", "coordinator", "client")
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name in sorted(_definitions(path) & FACTS)
    ]
    assert not redefined, "import these from dmq.proto instead:\n" + "\n".join(redefined)


def test_group_ids():
    assert group_id_for("orders", "billing") == "G_orders_billing"
    assert app_id_in("G_orders_billing", "orders") == "billing"
    assert app_id_in("G_orders_a_b", "orders") == "a_b"
    assert app_id_in("billing", "orders") is None
    assert app_id_in("G_orders_", "orders") is None  # no app id after the prefix
    assert app_id_in("G_orders_billing", "order") is None


def test_offset_markers_are_distinct_where_they_share_a_field():
    assert len({offset_markers.EARLIEST, offset_markers.LATEST}) == 2
    assert all(v < 0 for v in (offset_markers.EARLIEST, offset_markers.LATEST))
    assert len({offset_markers.START_AT_LOG_START, offset_markers.START_BY_TIMESTAMP}) == 2


@pytest.mark.parametrize(("partition", "acks"), [(0, 0), (3, pb.ACKS_ALL), (70_000, pb.ACKS_LEADER)])
def test_produce_framing_reads_as_the_generated_message(partition, acks):
    batch = bytes(range(256)) * 3
    parsed = pb.ProduceRequest.FromString(frame_produce_request("tópico", partition, acks, batch))
    assert (parsed.topic, parsed.partition, parsed.acks, parsed.batch) == ("tópico", partition, acks, batch)


def test_raw_method_paths_name_the_generated_methods():
    broker = pb.DESCRIPTOR.services_by_name["Broker"]
    assert PRODUCE_METHOD == f"/{broker.full_name}/{broker.methods_by_name['Produce'].name}"
    assert FETCH_METHOD == f"/{broker.full_name}/{broker.methods_by_name['Fetch'].name}"
