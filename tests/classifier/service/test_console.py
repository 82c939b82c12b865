"""The label console of `dyntc serve` in a real headless Chromium: every flow a person would use,
each checked in the store afterwards (DynamicClassifier.load), not only on the page.

Screenshots for docs/console.md: DYNTC_SCREENSHOTS=docs/img pytest tests/classifier/service/test_console.py"""

import pytest
from _browser import (by_id, click, css, error_says, fill, missing, shot, sign_in, start_browser, status_says,
                      stop_browser, viewport, visit, wait)
from _server import Server, eventually
from _toy import LABELS

from dyntc import DynamicClassifier

pytest.importorskip("fastapi")
why = missing()
pytestmark = pytest.mark.skipif(why is not None, reason=f"browser tests: {why}")



@pytest.fixture(scope="module")
def browser():
    driver = start_browser()
    yield driver
    stop_browser(driver)


@pytest.fixture(scope="module")
def server(fitted, tmp_path_factory):
    # a margin of 1 captures every predicted text: the inbox flows need captured texts, not a tuned model
    with Server.serving(fitted, tmp_path_factory.mktemp("console"),
                        args=["--capture", "50", "--capture-margin", "1"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def readonly(fitted, tmp_path_factory):
    with Server.serving(fitted, tmp_path_factory.mktemp("console-ro"), token=None) as srv:
        yield srv


@pytest.fixture
def page(browser, server):
    """The browser on the token server, signed out, at 1280x800."""
    viewport(browser, 1280, 800)
    browser.get(server.url + "/")
    browser.execute_script("sessionStorage.clear()")
    visit(browser, server.url + "/")
    return browser


def open_inbox_signed_in(browser, srv) -> None:
    """The inbox of `srv` in a fresh tab state (no discovery job remembered), signed in, at 1280x800."""
    viewport(browser, 1280, 800)
    visit(browser, srv.url + "/console/inbox")
    browser.execute_script("sessionStorage.clear()")
    visit(browser, srv.url + "/console/inbox")
    sign_in(browser)


def stored(server) -> DynamicClassifier:
    return DynamicClassifier.load(server.model)


def test_sign_in_add_a_label_and_try_it(page, server):
    assert by_id(page, "add-label-form").find_element("css selector", "fieldset").get_attribute("disabled")
    sign_in(page, "not-the-token-at-all-123")
    error_says(page, "does not accept this token")
    assert not by_id(page, "signed-in").is_displayed()
    sign_in(page)
    shot(page, "labels")
    fill(page, "new-name", "greeting")
    fill(page, "new-examples", "hello there\ngood morning\nhi, how are you")
    click(page, "#add-label-form button[type=submit]")
    wait(page, lambda d: d.find_element("tag name", "h1").text == "greeting", "the new label's page")
    status_says(page, "Label greeting added")
    assert [td.text for td in css(page, "table.examples tbody td:last-child")] == \
        ["hello there", "good morning", "hi, how are you"]
    clf = stored(server)
    assert clf.support("greeting") == ["hello there", "good morning", "hi, how are you"]
    shot(page, "label")

    visit(page, server.url + "/console/try")
    fill(page, "try-text", "hello there, good morning")
    click(page, "#try-form button[type=submit]")
    wait(page, lambda d: by_id(d, "try-results").is_displayed(), "the prediction")
    assert by_id(page, "try-verdict").get_attribute("data-label") == "greeting"
    ranked = [tr.find_elements("css selector", "td")[1].text for tr in css(page, "#try-table tbody tr")]
    assert ranked[0] == "greeting" and len(ranked) == 5 and set(ranked) <= set(clf.classes_)
    assert "not calibrated" in page.find_element("css selector", "main").text
    shot(page, "try")


def test_edit_a_label_page(page, server):
    sign_in(page)
    server.call("POST", "/labels", {"name": "bye", "examples": ["goodbye", "see you", "bye now"]})
    visit(page, server.url + "/console/labels/bye")
    fill(page, "more-examples", "farewell\nlater")
    click(page, "#add-examples-form button[type=submit]")
    status_says(page, "2 example(s) added")
    wait(page, lambda d: len(css(d, "table.examples tbody tr")) == 5, "the two new examples")
    assert stored(server).support("bye") == ["goodbye", "see you", "bye now", "farewell", "later"]
    for text in ("see you", "later"):
        css(page, f"input[name=example][value='{text}']")[0].click()
    click(page, "#examples-form button[type=submit]")
    status_says(page, "2 example(s) removed")
    assert stored(server).support("bye") == ["goodbye", "bye now", "farewell"]
    fill(page, "rename-to", "farewell")
    click(page, "#rename-form button[type=submit]")
    wait(page, lambda d: d.find_element("tag name", "h1").text == "farewell", "the renamed label's page")
    clf = stored(server)
    assert "bye" not in clf.classes_ and clf.support("farewell") == ["goodbye", "bye now", "farewell"]


def test_merge_two_labels(page, server):
    sign_in(page)
    server.call("POST", "/labels", {"name": "thanks", "examples": ["thank you", "thanks a lot"]})
    server.call("POST", "/labels", {"name": "cheers", "examples": ["cheers mate"]})
    visit(page, server.url + "/?q=h")  # the search narrows the table; both labels match
    for name in ("thanks", "cheers"):
        css(page, f"input[name=label][value='{name}']")[0].click()
    fill(page, "merge-into", "gratitude")
    click(page, "#merge-form button[type=submit]")
    wait(page, lambda d: d.find_element("tag name", "h1").text == "gratitude", "the merged label's page")
    clf = stored(server)
    assert "thanks" not in clf.classes_ and "cheers" not in clf.classes_
    assert sorted(clf.support("gratitude")) == ["cheers mate", "thank you", "thanks a lot"]


def test_split_one_label(page, server):
    from selenium.webdriver.support.ui import Select

    sign_in(page)
    server.call("POST", "/labels", {"name": "money", "examples": ["pay my bill", "pay the rent", "send money to bob",
                                                                  "transfer 20 to alice", "old text"]})
    visit(page, server.url + "/console/labels/money")
    click(page, "a[href$='/split']")
    wait(page, lambda d: css(d, "#split-form"), "the split page")
    wait(page, lambda d: not css(d, "#split-form fieldset")[0].get_attribute("disabled"), "the form to be enabled")
    fill(page, "part-a", "payment")
    fill(page, "part-b", "transfer")
    choice = {"pay my bill": "a", "pay the rent": "a", "send money to bob": "b", "transfer 20 to alice": "b",
              "old text": ""}
    for select in css(page, "select[name=part]"):
        Select(select).select_by_value(choice[select.get_attribute("data-text")])
    shot(page, "split")
    click(page, "#split-form button[type=submit]")
    status_says(page, "money split into payment and transfer")
    clf = stored(server)
    assert "money" not in clf.classes_
    assert clf.support("payment") == ["pay my bill", "pay the rent"]
    assert clf.support("transfer") == ["send money to bob", "transfer 20 to alice"]


def test_restore_an_older_version_and_see_the_difference(page, server):
    sign_in(page)
    before = stored(server)
    version, labels = before.version_, before.support_counts()
    server.call("POST", "/labels/alarm/rename", {"to": "wake up"})
    server.call("DELETE", "/labels/weather")
    visit(page, server.url + "/console/versions")
    changes = [tr.find_elements("css selector", "td")[2].text for tr in css(page, "table.versions tbody tr")[:2]]
    assert changes == ["removed weather", "renamed alarm → wake up"]
    shot(page, "versions")
    page.find_element("css selector", f"input[name=a][value='{version}']").click()
    click(page, "#diff-form button[type=submit]")
    wait(page, lambda d: css(d, "#labels-renamed"), "the difference page")
    assert by_id(page, "labels-renamed").text == "alarm → wake up"
    assert by_id(page, "labels-removed").text == "weather (10 examples)"
    shot(page, "diff")
    visit(page, server.url + "/console/versions")
    wait(page, lambda d: css(d, f"button.restore[data-version='{version}']")[0].is_enabled(), "the restore button")
    click(page, f"button.restore[data-version='{version}']")
    wait(page, lambda d: by_id(d, "confirm").is_displayed(), "the confirmation")
    assert f"Restore version {version}?" in by_id(page, "confirm-text").text
    by_id(page, "confirm-cancel").click()  # cancelled: nothing changes
    wait(page, lambda d: not by_id(d, "confirm").is_displayed(), "the dialog to close")
    assert stored(server).version_ == version + 2
    click(page, f"button.restore[data-version='{version}']")
    wait(page, lambda d: by_id(d, "confirm").is_displayed(), "the confirmation")
    by_id(page, "confirm-ok").click()
    status_says(page, f"Version {version} restored")
    clf = stored(server)
    assert clf.version_ == version + 3 and clf.support_counts() == labels
    visit(page, server.url + "/")
    assert {a.text for a in css(page, "table.labels tbody a")} >= {"alarm", "weather"}


def test_accept_captured_texts_from_the_inbox(page, server):
    texts = ["where is my parcel", "track my package please", "my parcel has not arrived"]
    assert server.call("POST", "/predict", {"texts": texts})[0] == 200
    assert eventually(lambda: {c["text"] for c in server.call("GET", "/captures?limit=1000")[1]["captures"]}
                      >= set(texts), timeout=20)
    visit(page, server.url + "/console/inbox")
    assert by_id(page, "locked").is_displayed()  # no captured text without the token
    assert "parcel" not in page.page_source
    sign_in(page)
    wait(page, lambda d: css(d, "#captures-form"), "the captured texts")
    assert {td.text for td in css(page, "table.captures tbody td:nth-child(2)")} >= set(texts)
    shot(page, "inbox")
    assert not css(page, "#captures-form button[value=out-of-scope]")  # not calibrated: no such choice, and why
    assert "calibrate the model first" in by_id(page, "captures-form").text
    for text in texts:
        css(page, f"input[name=text][value='{text}']")[0].click()
    fill(page, "cap-name", "delivery")
    css(page, "#captures-form button[value=accept]")[0].click()
    status_says(page, "3 text(s) now label delivery")
    assert sorted(stored(server).support("delivery")) == sorted(texts)
    remaining = {c["text"] for c in server.call("GET", "/captures?limit=1000")[1]["captures"]}
    assert not remaining & set(texts)


def test_mark_captured_texts_out_of_scope(browser, fitted, tmp_path):
    """On a calibrated model the inbox offers "Out of scope": the selected texts become the
    calibration's out-of-scope examples in one version and leave the inbox."""
    import warnings

    from _toy import TEXTS

    from dyntc.errors import DyntcWarning

    clf = fitted.copy()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DyntcWarning)  # a small held-out set: not what this tests
        clf.calibrate([t for y in TEXTS for t in TEXTS[y][:3]], [y for y in TEXTS for _ in range(3)])
    jokes = ["tell me a joke", "tell me a funny joke please", "sing me a song"]
    with Server.serving(clf, tmp_path, args=["--capture", "50", "--capture-margin", "1"]) as srv:
        srv.call("POST", "/predict", {"texts": jokes})
        assert eventually(lambda: {c["text"] for c in srv.call("GET", "/captures")[1]["captures"]} >= set(jokes),
                          timeout=20)
        open_inbox_signed_in(browser, srv)
        wait(browser, lambda d: css(d, "#captures-form button[value=out-of-scope]"), "the out-of-scope choice")
        assert "requests no label should take" in by_id(browser, "captures-form").text
        for text in jokes[:2]:
            css(browser, f"input[name=text][value='{text}']")[0].click()
        css(browser, "#captures-form button[value=out-of-scope]")[0].click()
        status_says(browser, "2 text(s) kept as out of scope")
        model = DynamicClassifier.load(srv.model)
        assert sorted(model.calibration_.oos_examples) == sorted(jokes[:2]) and model.version_ == 2
        assert {c["text"] for c in srv.call("GET", "/captures")[1]["captures"]} & set(jokes) == {jokes[2]}
        # a proposed cluster can be marked out of scope too
        more = ["play some jazz", "play music by miles davis", "put on some jazz music", "play a jazz song",
                "what's my credit score", "show my credit score", "how is my credit score", "credit score check"]
        srv.call("POST", "/predict", {"texts": more})
        assert eventually(lambda: {c["text"] for c in srv.call("GET", "/captures")[1]["captures"]} >= set(more),
                          timeout=20)
        visit(browser, srv.url + "/console/inbox")
        click(browser, "#discover-form button[type=submit]")
        wait(browser, lambda d: css(d, "form.cluster button[value=out-of-scope]"), "the proposed clusters")
        first = css(browser, "form.cluster")[0]
        kept = [box.get_attribute("value") for box in first.find_elements("css selector", "input[name=text]")]
        first.find_element("css selector", "button[value=out-of-scope]").click()
        status_says(browser, f"{len(kept)} text(s) kept as out of scope")
        assert set(DynamicClassifier.load(srv.model).calibration_.oos_examples) == set(jokes[:2]) | set(kept)


@pytest.mark.skipif(not hasattr(DynamicClassifier, "discover"), reason="DynamicClassifier.discover is not in this tree")
def test_accept_a_proposed_cluster(page, server):
    texts = ["play some jazz", "play music by miles davis", "put on some jazz music", "play a jazz song",
             "what's my credit score", "show my credit score", "how is my credit score", "credit score check"]
    server.call("POST", "/predict", {"texts": texts})
    assert eventually(lambda: len({c["text"] for c in server.call("GET", "/captures?limit=1000")[1]["captures"]}
                                  & set(texts)) >= 6, timeout=20)
    visit(page, server.url + "/console/inbox")
    sign_in(page)
    wait(page, lambda d: css(d, "#discover-form"), "the inbox")
    assert not css(page, "#adapt-min")  # the hashing encoder has no backbone to adapt: no such choice
    click(page, "#discover-form button[type=submit]")
    wait(page, lambda d: css(d, "form.cluster"), "the proposed clusters")
    first = css(page, "form.cluster")[0]
    assert not first.find_elements("css selector", "button[value=out-of-scope]")  # not calibrated
    page.execute_script("arguments[0].scrollIntoView()", by_id(page, "clusters-h"))
    shot(page, "clusters")
    kept = [box.get_attribute("value") for box in first.find_elements("css selector", "input[name=text]")]
    name = first.find_element("css selector", "input[name=name]")
    name.clear()
    name.send_keys("new intent")
    first.find_element("css selector", "button[value=accept]").click()
    status_says(page, "now label new intent")
    assert stored(server).support("new intent") == kept


@pytest.mark.data
def test_propose_labels_after_adapting_the_model_to_the_captured_texts(browser, clinc_intents, tmp_path):
    """MiniLM, whose backbone a discovery may adapt: the console starts the job, follows it, and
    shows the clusters it found; accepting one is a label."""
    pytest.importorskip("sentence_transformers")
    known, new = ["alarm", "balance", "timer", "weather"], ["book_hotel", "translate"]
    clf = DynamicClassifier(head=None).fit([t for y in known for t in clinc_intents[y][:8]],
                                           [y for y in known for _ in range(8)])
    texts = [t for y in known + new for t in clinc_intents[y][8:28]]
    with Server.serving(clf, tmp_path, max_batch=64, args=["--capture", "500", "--capture-margin", "1"]) as srv:
        for i in range(0, len(texts), 64):
            assert srv.call("POST", "/predict", {"texts": texts[i:i + 64]})[0] == 200
        assert eventually(lambda: srv.call("GET", "/captures?limit=1")[1]["total"] == len(texts), timeout=30)
        open_inbox_signed_in(browser, srv)
        wait(browser, lambda d: css(d, "#adapt-min"), "the choice to adapt the model")
        assert by_id(browser, "adapt-min").get_attribute("max") == "15"  # --max-adapt-s 900 by default
        fill(browser, "n-new", "2")
        fill(browser, "adapt-min", "0.05")  # 3 s of training
        click(browser, "#discover-form button[type=submit]")
        status_says(browser, "Adapting the model to the captured texts")
        visit(browser, srv.url + "/console/versions")  # away and back: the inbox picks the job up again
        visit(browser, srv.url + "/console/inbox")
        wait(browser, lambda d: css(d, "form.cluster"), "the adapted discovery's clusters", timeout=300)
        first = css(browser, "form.cluster")[0]
        kept = [box.get_attribute("value") for box in first.find_elements("css selector", "input[name=text]")]
        assert len(kept) >= 3 and set(kept) <= set(texts)
        name = first.find_element("css selector", "input[name=name]")
        name.clear()
        name.send_keys("found intent")
        first.find_element("css selector", "button[value=accept]").click()
        status_says(browser, "now label found intent")
        assert DynamicClassifier.load(srv.model).support("found intent") == kept


@pytest.mark.skipif(not hasattr(DynamicClassifier, "suggest"), reason="DynamicClassifier.suggest is not in this tree")
def test_apply_a_merge_suggestion(page, server):
    halves = {"coin_a": ["flip a coin", "toss a coin for me", "heads or tails", "flip a coin to decide",
                         "coin toss please"],
              "coin_b": ["toss a coin", "can you flip a coin", "heads or tails please", "do a coin flip",
                         "flip the coin for me"]}
    # the module's server holds what earlier flows left (labels split, merged, accepted from clusters):
    # start from the fitted toy label set, so that the one planted merge is the question
    assert server.call("POST", "/versions/1/restore")[0] == 200
    for name, texts in halves.items():  # one intent under two names: a merge should be suggested
        assert server.call("POST", "/labels", {"name": name, "examples": texts})[0] == 201
    visit(page, server.url + "/console/inbox")
    sign_in(page)
    wait(page, lambda d: css(d, "#suggest-button"), "the inbox")
    click(page, "#suggest-button")
    wait(page, lambda d: css(d, "li.suggestion"), "the suggestions")
    merge = [li for li in css(page, "li.suggestion") if li.text.split("\n")[0] in ("merge: coin_a, coin_b", "merge: coin_b, coin_a")]
    assert merge, [li.text for li in css(page, "li.suggestion")]
    page.execute_script("arguments[0].scrollIntoView()", merge[0])
    shot(page, "suggestions")
    into = merge[0].find_element("css selector", "button").text.removeprefix("Merge into ")
    merge[0].find_element("css selector", "button").click()
    status_says(page, f"merged into {into}")
    clf = stored(server)
    assert sorted(clf.support(into)) == sorted(halves["coin_a"] + halves["coin_b"])
    assert not ({"coin_a", "coin_b"} - {into}) & set(clf.classes_)


def test_a_write_with_a_bad_token_shows_the_error(page, server):
    sign_in(page)
    version = stored(server).version_
    page.execute_script("sessionStorage.setItem('dyntc-token', 'a-rotated-old-token-0000')")
    fill(page, "new-name", "never")
    fill(page, "new-examples", "this is not stored")
    click(page, "#add-label-form button[type=submit]")
    message = error_says(page, "refused the token (401)")
    assert "Sign in again" in message
    shot(page, "error")
    clf = stored(server)
    assert clf.version_ == version and "never" not in clf.classes_


def test_a_read_only_visit_cannot_write(browser, readonly):
    viewport(browser, 1280, 800)
    version = stored(readonly).version_
    for path in ("/", "/console/labels/alarm", "/console/labels/alarm/split", "/console/versions"):
        visit(browser, readonly.url + path)
        assert "Read-only" in by_id(browser, "readonly").text
        assert not css(browser, "fieldset.write") and not css(browser, "button.restore") and not css(browser, "#signin")
    # the inbox is no anonymous read: without a token nothing captured can be shown
    visit(browser, readonly.url + "/console/inbox")
    assert by_id(browser, "locked").is_displayed()
    assert readonly.call("GET", "/captures", token=None)[0] == 403
    assert stored(readonly).version_ == version and list(stored(readonly).classes_) == sorted(LABELS)
    visit(browser, readonly.url + "/")
    shot(browser, "readonly")


def test_errors_in_words_and_every_field_labelled(page, server):
    visit(page, server.url + "/console/labels/no-such-label")
    assert "label 'no-such-label' does not exist" in page.find_element("css selector", "main").text
    visit(page, server.url + "/?page=99")
    assert "page 99 does not exist" in page.find_element("css selector", "main").text
    unlabelled = """return Array.from(document.querySelectorAll('input:not([type=hidden]), textarea, select'))
        .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.getAttribute('aria-labelledby'))
        .map(e => e.outerHTML)"""
    for path in ("/", "/console/labels/alarm", "/console/labels/alarm/split", "/console/try", "/console/versions",
                 "/console/versions/diff?a=1&b=2"):
        visit(page, server.url + path)
        assert page.execute_script(unlabelled) == [], path


def test_readable_on_a_narrow_window(page, server):
    viewport(page, 400, 800)
    try:
        for path in ("/", "/console/labels/alarm", "/console/versions", "/console/try"):
            visit(page, server.url + path)
            overflow = page.execute_script("return document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, (path, overflow)
        visit(page, server.url + "/")
        shot(page, "narrow")
    finally:
        viewport(page, 1280, 800)


def test_keyboard_reaches_every_control(page, server):
    from selenium.webdriver.common.keys import Keys

    sign_in(page)
    visit(page, server.url + "/")
    ident = "e => e.tagName + '|' + (e.id || e.name || '') + '|' + (e.value || e.getAttribute('href') || '')"
    controls = set(page.execute_script(f"""return Array.from(document.querySelectorAll('a[href], button, input, textarea, select'))
        .filter(e => !e.disabled && e.offsetParent !== null).map({ident})"""))
    reached = set()
    page.find_element("tag name", "body").send_keys(Keys.TAB)
    for _ in range(len(controls) + 5):
        reached.add(page.execute_script(f"return ({ident})(document.activeElement)"))
        page.switch_to.active_element.send_keys(Keys.TAB)
    assert controls <= reached, controls - reached


def test_with_a_read_token_pages_ask_to_sign_in(browser, fitted, tmp_path):
    (tmp_path / "read").write_text("read-token-0123456789\n")
    (tmp_path / "read").chmod(0o600)
    srv = Server(fitted.save(tmp_path / "model"), tmp_path, args=["--read-token-file", str(tmp_path / "read")])
    try:
        viewport(browser, 1280, 800)
        visit(browser, srv.url + "/")
        browser.execute_script("sessionStorage.clear()")
        visit(browser, srv.url + "/")
        assert by_id(browser, "locked").is_displayed() and "alarm" not in browser.find_element("tag name", "main").text
        sign_in(browser)
        wait(browser, lambda d: css(d, "table.labels a[href='/console/labels/alarm']"), "the labels after signing in")
        click(browser, "table.labels a[href='/console/labels/alarm']")  # a link is followed with the token
        wait(browser, lambda d: d.find_element("tag name", "h1").text == "alarm", "the label's page")
        assert browser.current_url.endswith("/console/labels/alarm") and not css(browser, "#locked")
        assert len(css(browser, "table.examples tbody tr")) == 10
    finally:
        srv.stop()
