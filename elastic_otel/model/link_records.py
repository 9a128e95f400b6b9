"""The ``torchelastic.link`` records: a :class:`~elastic_otel.model.links.LinkReport` (node 0's
finding) or a node's own evidence as attributes, and the record's body from them.
Design: ``docs/hangs.md`` (Slow links and slowdowns).
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_otel.model.interfaces import describe_interface
from elastic_otel.model.links import (
    MAX_EVIDENCE,
    LinkAttributes,
    LinkReport,
    NodeLinks,
    is_active,
    mean,
    megabytes,
    milliseconds,
    nic_state,
    number,
    path_facts,
    path_rate,
    rounded,
)
from elastic_otel.model.p2p_edges import describe_edge
from elastic_otel.names import attributes as A


def link_attributes(report: LinkReport) -> LinkAttributes:
    """The report's facts, as the ``torchelastic.link`` record's attributes."""
    attributes: LinkAttributes = {
        A.LINK_SCOPE: report.scope,
        A.LINK_TRANSPORT: report.transport,
    }
    if report.nodes:
        attributes[A.LINK_NODES] = tuple(n.host for n in report.nodes)
        attributes[A.LINK_NODE_RANK] = tuple(n.node_rank for n in report.nodes)
        attributes[A.LINK_ADDRESS] = tuple(a for n in report.nodes for a in n.addresses)
    optional = {
        A.LINK_RTT: report.rtt_s,
        A.LINK_RTT_OTHERS: report.rtt_others_s,
        A.LINK_RATE: report.rate,
        A.LINK_RATE_OTHERS: report.rate_others,
        A.LINK_RETRANSMITS: report.retransmits_s,
        A.LINK_RETRANSMITS_OTHERS: report.retransmits_others_s,
    }
    attributes.update({k: rounded(v) for k, v in optional.items() if v is not None})
    texts = {A.LINK_DEVICE: report.device, A.LINK_RDMA_RATE: report.rdma_rate}
    texts[A.LINK_RDMA_STATE] = report.rdma_state
    attributes.update({k: v for k, v in texts.items() if v is not None})
    if report.counters:
        attributes[A.LINK_RDMA_COUNTERS] = report.counters
    if report.evidence:
        attributes[A.LINK_EVIDENCE] = report.evidence
    return attributes


def local_evidence(node: NodeLinks) -> LinkAttributes:
    """A node's own evidence (scope ``local``), for its own records: its worst path (the
    highest RTT among those that sent in the window) against its others, and an RDMA port of
    its whose counters moved or whose state is not ACTIVE. Empty: nothing read."""
    if not node.peers and not node.nics and not node.interfaces and not node.edges:
        return {}
    attributes: LinkAttributes = {
        A.LINK_SCOPE: "local",
        A.LINK_TRANSPORT: "tcp" if node.peers else "rdma" if node.nics else "p2p",
        A.LINK_NODES: (node.host,),
        A.LINK_NODE_RANK: (node.node_rank,),
        A.LINK_ADDRESS: node.addresses,
    }
    paths = sorted(node.peers, key=lambda p: (not p.sending, -p.srtt_s))
    evidence = [f"{node.host} → {p.peer}: {path_facts(p)}" for p in paths[:MAX_EVIDENCE]]
    if paths:
        worst, others = paths[0], [p for p in paths[1:] if p.sending]
        attributes[A.LINK_PEER] = worst.peer
        values = {
            A.LINK_RTT: worst.srtt_s,
            A.LINK_RTT_OTHERS: mean(p.srtt_s for p in others),
            A.LINK_RATE: worst.delivery_rate,
            A.LINK_RATE_OTHERS: path_rate(others) if others else None,
            A.LINK_RETRANSMITS: worst.retransmits_s,
            A.LINK_RETRANSMITS_OTHERS: mean(p.retransmits_s for p in others),
        }
        attributes.update({k: rounded(v) for k, v in values.items() if v is not None})
    evidence += [f"{node.host} {describe_interface(f)}" for f in node.interfaces if f.slow_end]
    own = set(node.ranks)
    leaving = sorted(
        (e for e in node.edges if (e.src in own) != (e.dst in own)), key=lambda e: e.best_rate
    )
    evidence += [f"{node.host} {describe_edge(e)}" for e in leaving[:2]]
    troubled = [n for n in node.nics if n.errors or (n.state and not is_active(n.state))]
    if troubled:
        nic = max(troubled, key=lambda n: sum(v for _, v in n.errors))
        attributes[A.LINK_DEVICE] = f"{nic.device}/{nic.port}"
        attributes[A.LINK_RDMA_RATE] = nic.rate
        attributes[A.LINK_RDMA_STATE] = f"{nic.state} / {nic.phys_state}"
        attributes[A.LINK_RDMA_COUNTERS] = tuple(f"{k}={v}" for k, v in nic.errors)
        evidence += [f"{node.host} {n.device}/{n.port}: {nic_state(n)}" for n in troubled]
    if evidence:
        attributes[A.LINK_EVIDENCE] = tuple(evidence[:MAX_EVIDENCE])
    return attributes


def describe_link(attributes: Mapping[str, object]) -> str:
    """The body of a link record, by scope: "host-b (node rank 1, 10.1.0.12) has the slow
    link: its connections to every peer deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms
    (0.1 ms), 31 retransmits a second (0)"; "the link between host-a (...) and host-b (...) is
    slow: ..."; "every link of the job is slow: ..."; "mlx5_0 port 1 of host-b: symbol_error
    +1,204, link_downed +3 over the window; ..."; a node's own: "this node's slowest path goes
    to 10.1.0.11: ..."."""
    scope = attributes.get(A.LINK_SCOPE)
    nodes = _named_nodes(attributes)
    if scope == "nic":
        return _describe_nic(attributes, nodes[0] if nodes else "?")
    if scope == "local":
        parts = []
        if A.LINK_PEER in attributes:
            parts.append(f"this node's slowest path goes to {attributes[A.LINK_PEER]}: ")
            parts[-1] += _stats(attributes, "it delivers", "its other paths ")
        if A.LINK_DEVICE in attributes:
            parts.append(_describe_nic(attributes, "this node"))
        return "; ".join(parts) or "no link statistics"
    p2p = attributes.get(A.LINK_TRANSPORT) == "p2p"
    what, verb = ("sends and receives", "move at best") if p2p else ("connections", "deliver")
    if scope == "fabric":
        return f"every link of the job is slow: its {what} " + _stats(attributes, verb)
    if scope == "link" and len(nodes) == 2:
        pair = f"the link between {nodes[0]} and {nodes[1]} is slow"
        return f"{pair}: its {what} " + _stats(attributes, verb)
    if len(nodes) > 1:
        who = f"{', '.join(nodes[:-1])} and {nodes[-1]} have slow links: their"
    else:
        who = f"{nodes[0] if nodes else '?'} has the slow link: its"
    text = f"{who} {what} to every peer " + _stats(attributes, verb)
    evidence = attributes.get(A.LINK_EVIDENCE)
    if attributes.get(A.LINK_TRANSPORT) == "netdev" and isinstance(evidence, tuple | list):
        own = [str(line).split(" ", 1)[-1] for line in evidence if "a second held back" in line]
        text += f"; its own interface held traffic back: {own[0]}" if own else ""
    return text


def _named_nodes(attributes: Mapping[str, object]) -> list[str]:
    """Each node named, as "host-b (node rank 1, 10.1.0.12)"."""
    hosts, ranks = attributes.get(A.LINK_NODES), attributes.get(A.LINK_NODE_RANK)
    if not isinstance(hosts, tuple | list):
        return []
    ranks = ranks if isinstance(ranks, tuple | list) and len(ranks) == len(hosts) else None
    addresses = attributes.get(A.LINK_ADDRESS)
    addresses = addresses if isinstance(addresses, tuple | list) else ()
    named = []
    for i, host in enumerate(hosts):
        facts = [f"node rank {ranks[i]}"] if ranks else []
        if len(addresses) == len(hosts):
            facts.append(str(addresses[i]))
        named.append(f"{host} ({', '.join(facts)})" if facts else str(host))
    return named


def _stats(attributes: Mapping[str, object], verb: str, others: str = "the others ") -> str:
    """What the attributes have of "deliver 0.06 MB/s (the others 110 MB/s), RTT 420 ms
    (0.1 ms), 31 retransmits a second (0)"."""
    parts: list[str] = []
    for key, other, say, unit in (
        (A.LINK_RATE, A.LINK_RATE_OTHERS, f"{verb} {{}}", megabytes),
        (A.LINK_RTT, A.LINK_RTT_OTHERS, "RTT {}", milliseconds),
        (A.LINK_RETRANSMITS, A.LINK_RETRANSMITS_OTHERS, "{} retransmits a second", number),
    ):
        value, then = attributes.get(key), attributes.get(other)
        if isinstance(value, int | float):
            text = say.format(unit(value))
            if isinstance(then, int | float):
                text += f" ({others if not parts else ''}{unit(then)})"
            parts.append(text)
    return ", ".join(parts) or "no statistics"


def _describe_nic(attributes: Mapping[str, object], node: str) -> str:
    device, _, port = str(attributes.get(A.LINK_DEVICE, "?")).partition("/")
    text = f"{device} port {port or '?'} of {node}"
    counters = attributes.get(A.LINK_RDMA_COUNTERS)
    if isinstance(counters, tuple | list) and counters:
        text += f": {', '.join(_moved_text(str(c)) for c in counters)} over the window"
    state, rate = attributes.get(A.LINK_RDMA_STATE), attributes.get(A.LINK_RDMA_RATE)
    facts = [f"state {state}" if state else "", f"rate {rate}" if rate else ""]
    if facts := [f for f in facts if f]:
        text += "; " + ", ".join(facts)
    moved_s, usual = attributes.get(A.LINK_RATE), attributes.get(A.LINK_RATE_OTHERS)
    if attributes.get(A.LINK_SCOPE) == "nic" and isinstance(moved_s, int | float):
        text += f"; it moves {megabytes(moved_s)}"
        text += f" (the others {megabytes(usual)})" if isinstance(usual, int | float) else ""
    return text


def _moved_text(counter: str) -> str:
    """``symbol_error=1204`` → ``symbol_error +1,204``."""
    name, _, delta = counter.partition("=")
    return f"{name} +{int(delta):,}" if delta.isdigit() else counter
