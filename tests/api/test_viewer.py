"""The attention viewer in a real headless Chromium against the real server on loopback.

Skips when Playwright or a Chromium binary is missing; `.ci/run` installs both so CI runs it.
"""
from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest
from conftest import CHROMIUM, ROOT, headless_chromium, running_server

playwright_api = pytest.importorskip("playwright.sync_api")
if not CHROMIUM:
    pytest.skip("no Chromium binary installed", allow_module_level=True)

ARTIFACTS = ROOT / "test-artifacts"
SOURCE = "Zwei Hunde spielen im Schnee."


@pytest.fixture(scope="module")
def server(models_dir):
    with running_server(models_dir) as base:
        yield base


@pytest.fixture(scope="module")
def browser():
    with headless_chromium() as b:
        yield b


@pytest.fixture
def page(browser, server):
    context = browser.new_context(accept_downloads=True, viewport={"width": 1200, "height": 900})
    page = context.new_page()
    page.goto(server + "/")  # redirects to /ui/
    page.wait_for_function("document.querySelectorAll('#pair option').length >= 2")
    yield page
    context.close()


def attention_from_api(server: str, text: str) -> dict:
    request = urllib.request.Request(
        server + "/v1/attention", data=json.dumps({"text": text, "source": "de", "target": "en"}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())


def heatmap_weights(page) -> list[str]:
    return page.eval_on_selector_all("#heatmap rect.cell", "cells => cells.map(c => c.dataset.weight)")


def show_attention(page) -> None:
    """Click "Show attention" and wait for the maps; a failure shows the message the page shows."""
    page.click("#run")
    page.wait_for_selector("#result:not([hidden]), #error:not([hidden])")
    assert page.is_hidden("#error"), page.text_content("#error")


def shown(token: str) -> str:
    """A token as the viewer labels it: without sentencepiece's word-start marker, a lone one as ␣."""
    rest = token[1:] if token.startswith("▁") else token
    return "␣" if token and not rest else rest.replace("▁", "␣")


def labels(page, selector: str) -> list[str]:
    return page.eval_on_selector_all(selector, "t => t.map(x => x.textContent)")


def test_translation_and_heatmap_appear(page, server):
    page.fill("#source", SOURCE)
    show_attention(page)
    expected = attention_from_api(server, SOURCE)
    assert page.text_content("#translation") == expected["translation"]
    rows, cols = labels(page, "#heatmap text.row-label"), labels(page, "#heatmap text.col-label")
    assert rows == [shown(t) for t in expected["target_tokens"]] and cols == [shown(t) for t in expected["source_tokens"]]
    assert any(t.startswith("▁") for t in expected["source_tokens"])  # so the labels below had markers to drop
    assert len(heatmap_weights(page)) == len(rows) * len(cols)
    assert page.locator("#alignment line.link").count() == len(rows)
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "attention-viewer.png"), full_page=True)


def test_token_labels_have_no_word_marker(page):
    page.fill("#source", SOURCE)
    show_attention(page)
    for view in ("cross", "decoder_self", "encoder_self"):
        page.select_option("#view", view)
        texts = labels(page, "#heatmap text.row-label, #heatmap text.col-label, #alignment text")
        assert texts and not [t for t in texts if "▁" in t], view
        assert all(t.strip() for t in texts)  # a piece that is only a space still shows something
        page.hover("#heatmap rect.cell >> nth=0")
        assert "▁" not in page.text_content("#tooltip")


def test_heatmap_has_a_colour_legend_from_zero_to_the_largest_weight(page):
    page.fill("#source", SOURCE)
    show_attention(page)
    for average in (False, True):  # averaging over heads lowers the largest weight: the scale follows it
        page.set_checked("#average", average)
        legend = page.locator("#heatmap svg g.legend")
        assert legend.count() == 1 and legend.locator("rect.legend-bar").count() == 1
        weights = [float(w) for w in heatmap_weights(page)]
        top = float(legend.get_attribute("data-max"))
        assert abs(top - max(weights)) < 1e-4
        ticks = labels(page, "#heatmap g.legend text.legend-tick")
        assert ticks[0] == "0" and abs(float(ticks[-1]) - top) <= 0.005
        # the darkest cell has the colour at the top end of the bar
        stops = page.eval_on_selector_all("#legend-gradient stop", "s => s.map(x => x.getAttribute('stop-color'))")
        fills = page.eval_on_selector_all("#heatmap rect.cell", "cells => cells.map(c => c.getAttribute('fill'))")
        assert fills[weights.index(max(weights))] == stops[-1]
    # the legend travels with the downloaded SVG
    with page.expect_download() as info:
        page.click("#download")
    svg = Path(info.value.path()).read_text()
    assert 'class="legend"' in svg and "legend-gradient" in svg


def test_switching_layer_head_and_average_changes_the_heatmap(page):
    page.fill("#source", SOURCE)
    show_attention(page)
    page.select_option("#layer", "0")
    page.select_option("#head", "0")
    first = heatmap_weights(page)
    page.select_option("#layer", "1")
    second_layer = heatmap_weights(page)
    assert second_layer != first
    page.select_option("#head", "2")
    assert heatmap_weights(page) != second_layer
    page.check("#average")
    assert page.is_disabled("#head") and heatmap_weights(page) != second_layer
    page.select_option("#view", "encoder_self")
    n_source = page.locator("#heatmap text.col-label").count()
    assert len(heatmap_weights(page)) == n_source * n_source


def test_hover_shows_tokens_and_weight(page):
    page.fill("#source", SOURCE)
    show_attention(page)
    page.hover("#heatmap rect.cell >> nth=0")
    tip = page.text_content("#tooltip")
    assert "→" in tip and any(ch.isdigit() for ch in tip)


def test_forced_decoding_and_svg_download(page):
    page.fill("#source", SOURCE)
    page.fill("#target", "Two dogs play in the snow.")
    show_attention(page)
    assert page.text_content("#translation") == "Two dogs play in the snow."
    with page.expect_download() as info:
        page.click("#download")
    path = Path(info.value.path())
    svg = path.read_text()
    assert svg.startswith("<svg") and svg.count('class="cell"') == len(heatmap_weights(page))
    assert info.value.suggested_filename.endswith(".svg")


def test_api_errors_are_shown_in_plain_words(page):
    # a pair the server does not serve (as from a stale page): the API's message reaches the user
    page.evaluate("""() => { const o = document.createElement('option'); o.value = 'fr-en'; o.textContent = 'fr → en';
                             document.getElementById('pair').appendChild(o); }""")
    page.select_option("#pair", "fr-en")
    page.fill("#source", "Un chien court.")
    page.click("#run")
    page.wait_for_selector("#error:not([hidden])")
    message = page.text_content("#error")
    assert "no model for fr->en" in message and "de-en" in message


def test_viewer_works_behind_an_api_key(browser, models_dir):
    with running_server(models_dir, "--api-keys", "sesame") as base:
        context = browser.new_context()
        page = context.new_page()
        page.goto(base + "/ui/")
        page.wait_for_selector("#error:not([hidden])")
        assert "API key" in page.text_content("#error")
        page.fill("#apikey", "sesame")
        page.dispatch_event("#apikey", "change")
        page.wait_for_function("document.querySelectorAll('#pair option').length >= 2")
        page.fill("#source", SOURCE)
        show_attention(page)
        assert page.is_hidden("#error")
        context.close()


def test_the_page_opens_on_a_pair_its_sample_sentence_is_in(browser, spm_model, tmp_path):
    """Served pairs that list cs -> de first (as the shipped multilingual checkpoint does): the page still opens on
    de -> en with its German sample, and the sample follows the pair until the user types their own sentence."""
    from conftest import make_checkpoint

    for seed, (source, target) in enumerate([("cs", "de"), ("de", "en"), ("en", "de")]):
        make_checkpoint(tmp_path / f"{source}-{target}", spm_model, source, target, seed=seed)
    with running_server(tmp_path) as base:
        context = browser.new_context()
        page = context.new_page()
        page.goto(base + "/ui/")
        page.wait_for_function("document.querySelectorAll('#pair option').length >= 3")
        assert page.eval_on_selector_all("#pair option", "o => o.map(x => x.value)")[0] == "cs-de"
        assert page.input_value("#pair") == "de-en"
        assert page.input_value("#source") == "Ein Hund rennt über die grüne Wiese."
        page.select_option("#pair", "en-de")
        assert page.input_value("#source") == "A dog runs across the green meadow."
        page.fill("#source", SOURCE)
        page.select_option("#pair", "de-en")
        assert page.input_value("#source") == SOURCE
        show_attention(page)
        context.close()
