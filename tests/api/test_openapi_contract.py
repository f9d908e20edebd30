"""The OpenAPI schema against the running server: schemathesis (`st run --checks all`) over every operation, with
API keys on, a bounded number of generated requests per operation and a fixed seed, so that it takes seconds.

Every check is on: no 5xx, statuses, headers and bodies as documented, requests the schema forbids refused
(negative data), requests it allows accepted (positive data), a missing key refused, and so on. The schema
carries the server's own limits and languages (docs.document_limits), so that what it allows is what the
server takes. What OpenAPI cannot say is left to the documented 400 on the operations it concerns, and
only there (EXPECTED_400): which pairs of languages have a model (/v1/attention translates no text to its
own language, and a job checks its pair when it is submitted), which files a file endpoint reads (the name's extension: a schema has no word for file
names), LibreTranslate's /translate, whose glossary and avoid extensions come in a form as JSON text (which
a schema's string cannot describe), a job's texts, which are checked when the job runs, and /v1/translate's
texts with `source: auto` (in which language a text is) and glossary terms (which characters a model can
write), and a stored glossary's entries (one of `entries` and `entries_tsv`, each source term with a word in it).
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import running_server

KEY = "contract-key"
MAX_EXAMPLES = 10
EXPECTED_400 = ["/v1/attention", "/v1/jobs", "/translate", "/translate_file", "/v1/translate_file", "/v1/jobs/file", "/v1/translate",
                "/v1/glossaries"]
POSITIVE = ["2xx", "3xx", "401", "403", "404", "409", "429"]  # schemathesis' default, without 5xx
# schemathesis' default and 413: a text or list over a limit the schema states (maxLength, maxItems) is refused
# as too large
NEGATIVE = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429"]


def config(path: Path) -> Path:
    lines = ["[checks.positive_data_acceptance]", f"expected-statuses = {POSITIVE!r}".replace("'", '"'), "",
             "[checks.negative_data_rejection]", f"expected-statuses = {NEGATIVE!r}".replace("'", '"'), ""]
    for operation in EXPECTED_400:
        lines += ["[[operations]]", f'include-path = "{operation}"', "[operations.checks.positive_data_acceptance]",
                  f"expected-statuses = {POSITIVE + ['400']!r}".replace("'", '"'), ""]
    path.write_text("\n".join(lines))
    return path


@pytest.fixture(scope="module")
def secured(models_dir):
    # a small character limit keeps the generated texts (and so the work of the random models) short
    with running_server(models_dir, "--api-keys", KEY, "--max-chars-per-text", "200") as url:
        yield url


def test_every_operation_keeps_the_contract(secured, tmp_path):
    st = Path(sys.executable).with_name("st")
    run = subprocess.run(
        [str(st), "--config-file", str(config(tmp_path / "schemathesis.toml")), "run", secured + "/openapi.json",
         "--checks", "all", "--header", f"Authorization: Bearer {KEY}", "--max-examples", str(MAX_EXAMPLES),
         "--seed", "29", "--generation-database", "none", "--no-shrink", "--phases", "examples,coverage,fuzzing",
         "--workers", "1", "--request-timeout", "30", "--no-color"],
        # one worker: with two, hypothesis's ast.parse in both threads at once trips CPython 3.11's "AST
        # constructor recursion depth mismatch" (a SystemError in the tool, not the server); one is as fast
        capture_output=True, text=True, timeout=300, cwd=tmp_path,  # (st keeps a .schemathesis/ where it runs)
    )
    out = run.stdout
    assert run.returncode == 0, out[-8000:] + run.stderr[-2000:]
    selected, listed = map(int, re.search(r"Selected: (\d+)/(\d+)", out).groups())
    tested = int(re.search(r"Tested: (\d+)", out).group(1))
    assert selected == listed == tested >= 15, out[-2000:]  # every operation the schema lists


def test_types_are_the_schemas(secured):
    """What the issue found accepted against the schema, and its opposite: a request the schema allows."""
    import httpx

    auth = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=secured, headers=auth, timeout=60) as http:
        for field, value in (("return_scores", 0), ("beam_size", "4"), ("split_sentences", "yes"), ("beam_size", True),
                             ("length_penalty", "1.0"), ("max_length", 0)):
            r = http.post("/v1/translate", json={"text": "Ein Hund rennt.", field: value})
            assert r.status_code == 422, (field, value, r.text)
            assert r.json()["error"]["type"] == "validation_error" and r.json()["error"]["param"] == field
        assert http.post("/v1/translate", json={"text": "Ein Hund rennt.", "beam_size": 4.0}).status_code == 200
        # more hypotheses than beams: the beam widens (the schema cannot say "at most beam_size")
        r = http.post("/v1/translate", json={"text": "Ein Hund rennt.", "beam_size": 1, "num_hypotheses": 3})
        assert r.status_code == 200 and len(r.json()["translations"][0]["hypotheses"]) == 3
        r = http.post("/translate", json={"q": "Ein Hund rennt.", "source": "de", "target": "en", "alternatives": -1})
        assert r.status_code == 400 and list(r.json()) == ["error"]
        r = http.post("/v1/attention", json={"text": "Ein Hund rennt.", "average_heads": True})
        assert r.status_code == 200 and "heads" not in r.json()  # optional in the schema, absent when averaged
        r = http.post("/v1/attention", json={"text": "Ein Hund rennt.", "average_heads": 1})
        assert r.status_code == 422
