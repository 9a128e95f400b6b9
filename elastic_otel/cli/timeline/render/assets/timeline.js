
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("timeline-data").textContent);
  var span = Math.max(data.duration, 0.001);
  var tooltip = document.getElementById("tooltip");
  var PHASES = ["stop_workers", "rendezvous", "assign_worker_ranks", "start_workers"];

  function el(tag, cls, text) {
    var node = document.createElement(tag);
    if (cls) { node.className = cls; }
    if (text !== undefined && text !== null) { node.textContent = text; }
    return node;
  }
  function pct(t) { return (100 * Math.max(0, t) / span) + "%"; }
  function secs(t) { return (t === null || t === undefined) ? "?" : "+" + t.toFixed(3) + "s"; }
  function dur(a, b) { return (b - a).toFixed(3) + "s"; }
  function count(n, what) { return n + " " + what + (n === 1 ? "" : "s"); }

  function tip(node, heading, lines) {
    node.setAttribute("aria-label", heading + ". " + lines.join(". "));
    node.addEventListener("mouseenter", function () {
      tooltip.textContent = "";
      tooltip.appendChild(el("b", null, heading));
      tooltip.appendChild(document.createTextNode(lines.join("\n")));
      tooltip.hidden = false;
    });
    node.addEventListener("mousemove", function (ev) {
      var x = Math.min(ev.clientX + 14, window.innerWidth - tooltip.offsetWidth - 8);
      var y = ev.clientY + 16;
      if (y + tooltip.offsetHeight > window.innerHeight) {
        y = ev.clientY - tooltip.offsetHeight - 10;
      }
      tooltip.style.left = x + "px";
      tooltip.style.top = y + "px";
    });
    node.addEventListener("mouseleave", function () { tooltip.hidden = true; });
  }

  function bar(track, cls, start, end, heading, lines) {
    var b = el("div", "bar " + cls);
    b.style.left = pct(start);
    b.style.width = "calc(" + pct(end - start) + " + 1px)";
    tip(b, heading, lines);
    track.appendChild(b);
    return b;
  }

  // A stall on a row: underlined for its length, and flagged at its start where the rank
  // waited for (or the node an agent's wait is on) is.
  function stallMarks(track, stalls, heading) {
    (stalls || []).forEach(function (s) {
      var lines = [s.text, secs(s.start) + " \u2192 " + secs(s.end) + " (" +
                   dur(s.start, s.end) + ", the latest report)"];
      if (s.frame) { lines.push("its innermost frame: " + s.frame); }
      var band = el("div", "stall-band " + s.role);
      band.style.left = pct(s.start);
      band.style.width = "calc(" + pct(s.end - s.start) + " + 1px)";
      tip(band, heading, lines);
      track.appendChild(band);
      if (s.role === "waiting") { return; }
      var mark = el("div", "stall-mark", s.role === "waited" ? "STALLED: waited for" : "STALLED");
      mark.style.left = pct(s.start);
      tip(mark, heading, lines);
      track.appendChild(mark);
    });
  }

  // A straggler on its worker's row: flagged at its first report, underlined to its last.
  function stragglerMarks(track, marks, heading) {
    (marks || []).forEach(function (s) {
      var lines = [s.text, "reported " + secs(s.start) + " \u2192 " + secs(s.end)];
      var band = el("div", "straggler-band");
      band.style.left = pct(s.start);
      band.style.width = "calc(" + pct(s.end - s.start) + " + 1px)";
      tip(band, heading, lines);
      track.appendChild(band);
      var mark = el("div", "straggler-mark", "STRAGGLER");
      mark.style.left = pct(s.start);
      tip(mark, heading, lines);
      track.appendChild(mark);
    });
  }

  // A slowdown on the row of each node that saw it: flagged where it began, underlined to its
  // end (or its latest report).
  function slowdownMarks(track, marks, heading) {
    (marks || []).forEach(function (s) {
      var lines = [s.text, secs(s.start) + " \u2192 " + secs(s.end) + " (" + dur(s.start, s.end) +
                   (s.ended ? ", ended)" : ", the latest report)")];
      var band = el("div", "slowdown-band");
      band.style.left = pct(s.start);
      band.style.width = "calc(" + pct(s.end - s.start) + " + 1px)";
      tip(band, heading, lines);
      track.appendChild(band);
      var mark = el("div", "slowdown-mark", "SLOWDOWN");
      mark.style.left = pct(s.start);
      tip(mark, heading, lines);
      track.appendChild(mark);
    });
  }

  function row(cls, label) {
    var r = el("div", "row " + cls);
    var l = el("div", "label", label);
    l.title = label;
    var t = el("div", "track");
    r.appendChild(l);
    r.appendChild(t);
    return { row: r, track: t };
  }

  function summary() {
    var nodes = {}, workers = 0;
    data.rounds.forEach(function (r) {
      r.nodes.forEach(function (n) { nodes[n.label] = 1; workers += n.workers.length; });
    });
    var t0 = new Date(data.t0_ms).toISOString().replace("T", " ").replace("Z", " UTC");
    document.getElementById("summary").textContent =
      "run " + data.runs.join(", ") + " \u00b7 " + count(data.rounds.length, "round") +
      " \u00b7 " + count(Object.keys(nodes).length, "node") + " \u00b7 " +
      count(workers, "worker run") + " \u00b7 " +
      data.duration.toFixed(3) + "s from " + t0;
  }

  function legend() {
    var box = document.getElementById("legend");
    [["join", "waiting to join the round"], ["member", "node in the round"],
     ["step", "agent rendezvous / rank assignment"], ["SUCCEEDED", "worker succeeded"],
     ["RUNNING", "worker running / unknown end"],
     ["RESTARTED", "worker restarted (membership change)"],
     ["failed REPLACED", "worker replaced after a failure"], ["failed", "worker failed"],
     ["failed PEER_FAILED", "worker failed because a peer did"],
     ["TERMINATED", "worker terminated"],
     ["LOST", "node or worker lost: never ended, drawn to when last heard"],
     ["recovery", "recovery: its agent restarting the workers"],
     ["phase stop_workers", "stop workers"], ["phase rendezvous", "rendezvous"],
     ["phase assign_worker_ranks", "assign ranks"],
     ["phase start_workers", "start workers"]].forEach(function (k) {
      var key = el("span", "key");
      var sw = el("span", "swatch bar " + k[0]);
      sw.style.position = "static";
      key.appendChild(sw);
      key.appendChild(document.createTextNode(k[1]));
      box.appendChild(key);
    });
    var key = el("span", "key");
    var line = el("span", "swatch");
    line.style.borderLeft = "2px dashed #b45309";
    line.style.width = "10px";
    key.appendChild(line);
    key.appendChild(document.createTextNode("restart / new round"));
    box.appendChild(key);
    key = el("span", "key");
    var flag = el("span", "swatch");
    flag.style.background = "#b45309";
    key.appendChild(flag);
    key.appendChild(document.createTextNode(
      "stall: from its start, on the rank waited for (the waiting ranks underlined)"));
    box.appendChild(key);
    key = el("span", "key");
    flag = el("span", "swatch");
    flag.style.background = "#ca8a04";
    key.appendChild(flag);
    key.appendChild(document.createTextNode(
      "straggler: its peers wait for it at every collective (first to last report)"));
    box.appendChild(key);
    key = el("span", "key");
    flag = el("span", "swatch");
    flag.style.background = "#9a3412";
    key.appendChild(flag);
    key.appendChild(document.createTextNode(
      "slowdown: a process group slower than the job's own pace (on each node that saw it)"));
    box.appendChild(key);
  }

  function axis(box) {
    var a = row("axis", "node / worker");
    var step = [0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 1800, 3600]
      .find(function (s) { return span / s <= 12; }) || Math.ceil(span / 12);
    for (var t = 0; t <= span + 1e-9; t += step) {
      var tick = el("div", "tick", "+" + (step < 1 ? t.toFixed(1) : Math.round(t)) + "s");
      tick.style.left = pct(t);
      a.track.appendChild(tick);
    }
    box.appendChild(a.row);
  }

  function nodeRows(box, n, round) {
    var head = n.label + (n.rank !== null ? " \u00b7 rank " + n.rank : "");
    var r = row("node", head);
    var where = round.label + ", " + n.label;
    if (n.join) {
      var failed = n.join.status === "ERROR";
      bar(r.track, "join" + (failed ? " error" : ""), n.join.start, n.join.end,
          (failed ? "rendezvous join FAILED" : "waiting to join") + " \u00b7 " + n.label,
          ["started " + secs(n.join.start) + ", waited " + dur(n.join.start, n.join.end),
           "rank " + (n.rank === null ? "?" : n.rank) + " of world size " +
             (n.world_size === null ? "?" : n.world_size),
           n.join.detail ? n.join.detail : where]);
    }
    if (n.member) {
      bar(r.track, "member" + (n.lost !== null ? " LOST" : ""), n.member.start, n.member.end,
          (n.lost !== null ? "LOST in " : "in ") + round.label + " \u00b7 " + n.label,
          [secs(n.member.start) + " \u2192 " + secs(n.member.end) + " (" +
             dur(n.member.start, n.member.end) + ")",
           n.lost !== null ? "lost: never ended its spans; last heard at " + secs(n.lost)
                           : "left the round: " + (n.member.detail || "-")]);
    }
    n.steps.forEach(function (s) {
      bar(r.track, "step", s.start, s.end, s.name + " \u00b7 " + n.label,
          [secs(s.start) + " \u2192 " + secs(s.end) + " (" + dur(s.start, s.end) + ")"]);
    });
    if (n.agent) {
      var m = el("div", "agent-end " + n.agent.state);
      m.style.left = pct(n.agent.end);
      tip(m, "agent " + n.agent.state + " \u00b7 " + n.label,
          ["at " + secs(n.agent.end)].concat(n.agent.message ? [n.agent.message] : []));
      r.track.appendChild(m);
    }
    stallMarks(r.track, n.stalls, "stalled \u00b7 " + n.label);
    slowdownMarks(r.track, n.slowdowns, "slowdown \u00b7 " + n.label);
    (n.lost_progress || []).forEach(function (x) {
      var band = el("div", "lost-band");
      band.style.left = pct(x.start);
      band.style.width = "calc(" + pct(x.end - x.start) + " + 1px)";
      var lines = [x.text, secs(x.start) + " \u2192 " + secs(x.end) + " (" +
                   dur(x.start, x.end) + ")"];
      tip(band, "lost progress \u00b7 " + n.label, lines);
      r.track.appendChild(band);
      var mark = el("div", "lost-mark", "LOST PROGRESS");
      mark.style.left = pct(x.start);
      tip(mark, "lost progress \u00b7 " + n.label, lines);
      r.track.appendChild(mark);
    });
    box.appendChild(r.row);
    n.recoveries.forEach(function (rec) {
      var rr = row("recovery", "recovery \u00b7 " + rec.cause);
      bar(rr.track, "recovery", rec.start, rec.end, "recovery \u00b7 " + n.label,
          [secs(rec.start) + " \u2192 " + secs(rec.end) + " (" + dur(rec.start, rec.end) + ")",
           rec.text]);
      rec.phases.forEach(function (p) {
        var known = PHASES.indexOf(p.name) >= 0 ? p.name : "other";
        var seg = bar(rr.track, "phase " + known, p.start, p.end,
                      p.name + " \u00b7 " + n.label,
                      [secs(p.start) + " \u2192 " + secs(p.end) + " (" + dur(p.start, p.end) + ")",
                       "a phase of its recovery (" + rec.cause + ")"]);
        seg.textContent = p.name.replace(/_/g, " ");
      });
      box.appendChild(rr.row);
    });
    n.workers.forEach(function (w) {
      var rank = w.rank === null ? "?" : w.rank;
      var role = w.role ? " " + w.role : "";
      var slow = (w.stragglers || []).length ? " straggler" : "";
      var wr = row("worker" + (w.failed ? " failed" : "") + role + slow,
                   "worker rank " + rank + " \u00b7 " + w.state);
      if (w.note) { wr.row.firstChild.title += " \u00b7 " + w.note; }
      var lines = [secs(w.start) + " \u2192 " + secs(w.end) + " (" + dur(w.start, w.end) + ")",
                   "node " + n.label + ", " + round.label];
      if (w.local_rank !== null) { lines.push("local rank " + w.local_rank); }
      if (w.exit !== null) { lines.push("exit code " + w.exit); }
      if (w.pid !== null) { lines.push("pid " + w.pid); }
      if (w.restarts !== null) { lines.push("agent restarts " + w.restarts); }
      if (w.message) { lines.push(w.message); }
      if (w.note) { lines.push(w.note); }
      if (w.last_words) { lines.push("last words (stderr):\n" + w.last_words); }
      var wb = bar(wr.track, w.state + (w.failed ? " failed" : "") + role, w.start, w.end,
                   "worker rank " + rank + " \u00b7 " + w.state, lines);
      if (w.role === "root") { wb.textContent = "ROOT CAUSE"; }
      stallMarks(wr.track, w.stalls, "stalled \u00b7 worker rank " + rank + " \u00b7 " + n.label);
      stragglerMarks(wr.track, w.stragglers,
                     "straggler \u00b7 worker rank " + rank + " \u00b7 " + n.label);
      box.appendChild(wr.row);
    });
  }

  function chart() {
    var main = document.getElementById("chart");
    var box = el("div", "chart-box");
    var overlay = el("div", "overlay");
    var restarts = [];
    axis(box);
    data.rounds.forEach(function (round) {
      var h = row("round-head" + (round.failed ? " failed" : ""), round.label);
      var bits = ["run " + round.run_id];
      if (round.world_size !== null) { bits.push("world size " + round.world_size); }
      bits.push(count(round.nodes.length, "node"));
      h.track.appendChild(document.createTextNode(bits.join(" \u00b7 ")));
      if (round.note) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "note", "\u21bb " + round.note));
      }
      if (round.outcome) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        var cls = round.failed ? "outcome-bad" : "outcome-good";
        h.track.appendChild(el("span", cls, round.outcome));
      }
      if (round.root_cause) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "root", "root cause: " + round.root_cause));
      }
      round.stalls.forEach(function (text) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "stall", "stalled: " + text));
      });
      (round.stragglers || []).forEach(function (text) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "straggler", "straggler: " + text));
      });
      (round.slowdowns || []).forEach(function (text) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "slowdown", "slowdown: " + text));
      });
      (round.links || []).forEach(function (text) {
        h.track.appendChild(document.createTextNode(" \u00b7 "));
        h.track.appendChild(el("span", "slow-link", "slow link: " + text));
      });
      box.appendChild(h.row);
      if (round.note) { restarts.push([round, h.row]); }
      round.nodes.forEach(function (n) { nodeRows(box, n, round); });
    });
    box.appendChild(overlay);
    main.appendChild(box);
    restarts.forEach(function (r) {
      var line = el("div", "restart-line");
      line.style.left = pct(r[0].start);
      line.style.top = (r[1].offsetTop + r[1].offsetHeight) + "px";
      line.title = r[0].note;
      overlay.appendChild(line);
    });
  }

  function errors() {
    if (!data.errors.length) { return; }
    var sec = document.getElementById("errors");
    sec.appendChild(el("h2", null, "Errors"));
    var list = el("ul");
    data.errors.forEach(function (e) {
      list.appendChild(el("li", null, secs(e.time) + "  " + e.where + ": " + e.message));
    });
    sec.appendChild(list);
  }

  summary();
  legend();
  chart();
  errors();
  document.body.setAttribute("data-rendered", "true");
})();
