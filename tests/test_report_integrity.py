"""A report cannot be made to lie: every string is escaped, and an edited audit.json shows no verdict.

audit.json carries a digest over its own content (which holds the hashes of the manifest, ledger
and chain head it audited); a report shows its verdict only when the digest matches, the verdict
follows from the checks and the hashes are the run's: otherwise TAMPERED or STALE, never PASS.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpledger.audit import audit_run
from dpledger.audit.audit import audit_digest, audit_integrity
from dpledger.decoding.config import config_from_dict
from dpledger.decoding.run import run_decode
from dpledger.reports import load_run, render
from dpledger.reports.html_text import escaped
from tests.micro import micro_config

HOSTILE = "</td></table><script>alert('dpledger')</script><img src=x onerror=\"alert(1)\">&amp;<!--"
"""Markup that would run or break the page if it reached the HTML unescaped."""


@pytest.fixture(scope="module")
def audited_run(micro_models, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("integrity") / "run"
    config = micro_config(micro_models, out, {"type": "voting", "votes": "coordinated", "aggregator": "dpargmax",
                                              "threshold": 2.0, "sigma": 1.0, "sigma_threshold": 1.0},
                          queries=16, block_size=8)
    run_decode(config_from_dict(config), progress=False, verbose=False)
    report = audit_run(out, mc_samples=20, play_game=False)
    assert report.verdict == "PASS"
    return out


def _with_audit(run: Path, tmp_path: Path, edit) -> Path:
    """A copy of the run whose audit.json is `edit`ed (edit returns the new content)."""
    import shutil

    copy = tmp_path / run.name
    shutil.copytree(run, copy)
    audit = json.loads((copy / "audit.json").read_text())
    (copy / "audit.json").write_text(json.dumps(edit(audit)))
    return copy


def _resealed(audit: dict) -> dict:
    """What someone who recomputes the digest after editing writes."""
    return {**audit, "digest": audit_digest(audit)}


def test_an_untouched_audit_is_shown_with_its_verdict(audited_run, tmp_path):
    assert audit_integrity(json.loads((audited_run / "audit.json").read_text())) is None
    html = render([load_run(audited_run)], "html")
    assert "verdict-PASS'>PASS</span>" in html


def _fail_audit(audit: dict) -> dict:
    """A genuine-looking FAIL: one check failed and the verdict says so, digest recomputed."""
    checks = [dict(c, status="FAIL", detail="the replay differs") if c["name"] == "replay" else c
              for c in audit["checks"]]
    return _resealed({**audit, "checks": checks, "verdict": "FAIL", "failed_checks": ["replay"]})


@pytest.mark.parametrize("edit, state", [
    (lambda a: {**_fail_audit(a), "verdict": "PASS"}, "TAMPERED"),                 # FAIL -> PASS, digest intact
    (lambda a: _resealed({**_fail_audit(a), "verdict": "PASS"}), "TAMPERED"),      # resealed, checks still FAIL
    (lambda a: {**a, "headline": "PASS for everything"}, "TAMPERED"),              # any field edited
    (lambda a: {k: v for k, v in a.items() if k != "digest"}, "STALE"),            # no digest: an older dpledger
    (lambda a: _resealed({**a, "audited": {**a["audited"], "head": "0" * 64}}), "STALE"),  # another run's audit
], ids=["fail-to-pass", "fail-to-pass-resealed", "headline-edited", "no-digest", "other-run"])
def test_an_edited_audit_is_never_shown_as_pass(audited_run, tmp_path, edit, state):
    run = load_run(_with_audit(audited_run, tmp_path, edit))
    assert run.audit is None and run.audit_withheld == state
    for output_format in ("html", "md", "json", "latex", "csv"):
        text = render([run], output_format)
        assert f"{state} audit, not shown" in text or output_format in ("csv", "latex")
        assert "'verdict-PASS'>" not in text and '"verdict": "PASS"' not in text
    html = render([run], "html")
    assert f"{state} audit, not shown" in html


def _hostile_strings(value, keep=("verdict", "status", "audited")):
    """Every string leaf replaced by HOSTILE, except enum fields the verdict is derived from (and the
    replay check's name) and the run hashes it is bound to, so that the audit stays consistent and
    is shown."""
    if isinstance(value, dict):
        return {key: item if key in keep or (key == "name" and item == "replay") else _hostile_strings(item, keep)
                for key, item in value.items()}
    if isinstance(value, list):
        return [_hostile_strings(item, keep) for item in value]
    return HOSTILE if isinstance(value, str) else value


@pytest.mark.parametrize("everything", [False, True], ids=["shown-audit", "every-string"])
def test_hostile_strings_in_every_audit_field_never_reach_the_html_unescaped(audited_run, tmp_path, everything):
    """Even resealed (a forger who recomputes the digest): the audit is shown, and every field of it
    that reaches the page is text. With every string replaced, enums included, the audit is not shown
    and the reason, which quotes the bad verdict, is text too."""
    edit = (lambda a: _resealed(_hostile_strings(a, keep=()))) if everything else (
        lambda a: _resealed(_hostile_strings(a)))
    run = load_run(_with_audit(audited_run, tmp_path, edit))
    assert (run.audit is None) == everything
    for output_format in ("html", "md"):  # Markdown renders raw HTML too
        text = render([run], output_format)
        assert HOSTILE not in text
        assert "<script" not in text
        assert "<img src=x" not in text
        quotes = output_format == "html"
        assert escaped(HOSTILE, quotes) in text or escaped(repr(HOSTILE), quotes) in text  # shown, as text


def test_one_escaping_function_serves_every_html_string():
    """reports/render.py and reports/hotpate.py build HTML only through dpledger.reports.html_text.escaped."""
    root = Path(__file__).resolve().parents[1] / "reports"
    for name in ("render.py", "hotpate.py"):
        source = (root / name).read_text()
        assert "html.escape" not in source and "import html\n" not in source
        assert "from dpledger.reports.html_text import escaped" in source
