"""``scalingnote index add | delete | rebuild`` on a tiny index."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from scalingnote.cli import app as cli
from scalingnote.live import LiveIndex


def _last_json(output: str) -> dict:
    line = [x for x in output.splitlines() if "{" in x][-1]  # (the progress bar shares the line)
    return json.loads(line[line.index('{"') :])


def test_add_delete_rebuild(live_index, tiny_bert_dir, tmp_path):
    docs = tmp_path / "new.jsonl"
    docs.write_text(
        "\n".join(json.dumps({"_id": f"c{i}", "title": f"capybara {i}", "text": "capybara river"}) for i in range(3))
        + "\n"
    )
    r = CliRunner().invoke(
        cli, ["index", "add", "--index", str(live_index), "--docs", str(docs), "--tower", str(tiny_bert_dir)]
    )
    assert r.exit_code == 0, r.output
    out = _last_json(r.output)
    assert out["upserted"] == 3 and out["stats"]["documents"] == 51 and out["compaction"]["generation"] == "gen-000001"
    ids = tmp_path / "ids.txt"
    ids.write_text("c0\nd3\n\n")
    r = CliRunner().invoke(cli, ["index", "delete", "--index", str(live_index), "--ids", str(ids)])
    assert r.exit_code == 0 and _last_json(r.output)["deleted"] == 2, r.output
    r = CliRunner().invoke(cli, ["index", "rebuild", "--index", str(live_index)])
    assert r.exit_code == 0, r.output
    out = _last_json(r.output)
    assert out["retrained"] and out["before"]["added_since_training"] == 3 and out["stats"]["added_share"] == 0
    live = LiveIndex.open(live_index, writer=False)
    assert len(live) == 49 and "c0" not in live.row_of and "c1" in live.row_of and "d3" not in live.row_of
    # `scalingnote search` on the same directory sees what `index add` / `delete` did (the current generation)
    for mode in ("bm25", "dense"):
        r = CliRunner().invoke(
            cli,
            [
                "search",
                "--index",
                str(live_index),
                "--query-tower",
                str(tiny_bert_dir),
                "--query",
                "capybara river",
                "--k",
                "51",
                "--mode",
                mode,
            ],
        )
        assert r.exit_code == 0, r.output
        hits = {json.loads(x)["doc_id"] for x in r.output.splitlines() if x.startswith("{")}
        assert {"c1", "c2"} <= hits and not hits & {"c0", "d3"}, (mode, sorted(hits))


def test_search_sees_batches_logged_but_not_compacted(live_index, tiny_bert_dir, tmp_path):
    """``index add --no-compact`` / ``index delete --no-compact`` only log the batch; ``search`` on
    the directory replays the log read-only (as ``serve`` does), in every mode and output form,
    without cutting or compacting it."""
    docs = tmp_path / "new.jsonl"
    docs.write_text(
        "\n".join(
            json.dumps({"_id": f"c{i}", "title": f"capybara {i}", "text": f"capybara river zzmark{i}q"})
            for i in range(3)
        )
        + "\n"
    )
    r = CliRunner().invoke(
        cli,
        [
            "index",
            "add",
            "--index",
            str(live_index),
            "--docs",
            str(docs),
            "--tower",
            str(tiny_bert_dir),
            "--no-compact",
        ],
    )
    assert r.exit_code == 0, r.output
    ids = tmp_path / "ids.txt"
    ids.write_text("c0\nd3\n")
    r = CliRunner().invoke(cli, ["index", "delete", "--index", str(live_index), "--ids", str(ids), "--no-compact"])
    assert r.exit_code == 0, r.output
    wal = sorted((live_index / "live" / "wal").iterdir())
    before = [p.read_bytes() for p in wal]
    for mode in ("bm25", "dense", "hybrid"):
        r = CliRunner().invoke(
            cli,
            [
                "search",
                "--index",
                str(live_index),
                "--query-tower",
                str(tiny_bert_dir),
                "--query",
                "capybara river zzmark1q",
                "--k",
                "60",
                "--mode",
                mode,
            ],
        )
        assert r.exit_code == 0, r.output
        hits = [json.loads(x) for x in r.output.splitlines() if x.startswith("{")]
        got = {h["doc_id"] for h in hits}
        assert {"c1", "c2"} <= got and not got & {"c0", "d3"}, (mode, sorted(got))
        assert next(h for h in hits if h["doc_id"] == "c1")["title"] == "capybara 1"  # the logged document's own title
    queries = tmp_path / "q.jsonl"
    queries.write_text(json.dumps({"_id": "q1", "text": "capybara river zzmark2q"}) + "\n")
    run = tmp_path / "run.trec"
    r = CliRunner().invoke(
        cli,
        [
            "search",
            "--index",
            str(live_index),
            "--query-tower",
            str(tiny_bert_dir),
            "--queries",
            str(queries),
            "--out",
            str(run),
            "--k",
            "60",
            "--mode",
            "dense",
        ],
    )
    assert r.exit_code == 0, r.output
    ranked = {line.split()[2] for line in run.read_text().splitlines()}
    assert "c2" in ranked and "c0" not in ranked and "d3" not in ranked
    assert [
        p.read_bytes() for p in sorted((live_index / "live" / "wal").iterdir())
    ] == before  # read-only: the log is untouched
    assert (
        not (live_index / "live" / "CURRENT").exists()
        or "gen-000001" not in (live_index / "live" / "CURRENT").read_text()
    )
