"""The results index (`bench/results_index/`): the checkout's front pages, index and JSON agree,
and each check fails, with a message that says what to fix, on a small checkout that breaks it:
(a) a result-looking number outside a marker, (b) a marker that disagrees with the index, (c) an
index entry its JSON disagrees with, (d) one key with two values in a benchmark's files."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import markdown
import pytest

from bench import results_index as ri

ENTRY: dict[str, Any] = {
    "id": "speedup",
    "label": "flex over sync",
    "script": "bench/toy.py",
    "file": "bench/results/toy.json",
    "key": "w.speedup",
    "fmt": ".2f",
    "shown": "1.28",
    "date": "2026-12-06",
    "machine": "2-core Intel Xeon VM",
    "repeats": 2,
    "spread": "1.16–1.42",
    "spread_of": {"kind": "ratio", "over": "w.sync", "under": "w.flex"},
}
RESULT: dict[str, Any] = {
    "date": "2026-12-06",
    "cpu": "Intel(R) Xeon(R) Processor (avx2)",
    "repeats": 2,
    "w": {"speedup": 1.2834, "sync": [1.266, 1.299], "flex": [1.095, 0.912], "wall_s": 9.5},
}
README = """# Toy

## Headline results

- flex is **<!-- r:speedup -->1.28<!-- /r -->×** sync (repeats
  span <!-- r:speedup:spread -->1.16–1.42<!-- /r -->; target ≥ 1.5).

## Other

Numbers here, 0.5 and 12%, are not headlines.
"""


def checkout(
    root: Path,
    *,
    entries: list[dict[str, Any]] | None = None,
    files: dict[str, Any] | None = None,
    readme: str = README,
    superseded: dict[str, str] | None = None,
) -> Path:
    """A checkout with one benchmark (`bench/toy.py`), its results and a README."""
    (root / "bench" / "results").mkdir(parents=True)
    (root / "bench" / "toy.py").write_text("")
    for name, data in (files if files is not None else {"toy.json": RESULT}).items():
        (root / "bench" / "results" / name).write_text(json.dumps(data))
    (root / "README.md").write_text(readme)
    index = {
        "readme": "README.md",
        "pages": ["README.md"],
        "headline_sections": ["Headline results"],
        "setup_phrases": ["target ≥ 1.5"],
        "superseded": superseded or {},
        "results": entries if entries is not None else [ENTRY],
    }
    (root / ri.INDEX).write_text(json.dumps(index, ensure_ascii=False))
    return root


def test_the_checkout_s_pages_index_and_json_agree() -> None:
    assert ri.problems() == []


def test_the_small_checkout_agrees(tmp_path: Path) -> None:
    assert ri.problems(checkout(tmp_path)) == []


# ---- (a) a result-looking number outside a marker --------------------------------------------


def test_a_headline_number_outside_a_marker_fails(tmp_path: Path) -> None:
    readme = README.replace("target ≥ 1.5).", "target ≥ 1.5); async 1.37× flex.")
    found = ri.problems(checkout(tmp_path, readme=readme))
    assert found == ["README.md '## Headline results': '1.37×' is not inside a results marker"]


def test_percentages_and_signed_deltas_count_integers_and_code_do_not(tmp_path: Path) -> None:
    text = "a 12% gain, +0.04 reward, 64×4×128 tokens, 100 steps, `ratio 0.9`, [x](a/1.2.md), 2026-12-06"
    assert ri.unmarked_numbers(text, ()) == ["12%", "+0.04"]
    assert ri.unmarked_numbers("RSS 0.402× (target ≤ 0.4)", ["target ≤ 0.4"]) == ["0.402×"]


def test_a_missing_headline_section_fails(tmp_path: Path) -> None:
    readme = README.replace("## Headline results", "## Results")
    assert "README.md: no section '## Headline results'" in ri.problems(
        checkout(tmp_path, readme=readme)
    )


# ---- (b) markers against the index -----------------------------------------------------------


def test_a_marker_that_disagrees_with_the_index_fails(tmp_path: Path) -> None:
    readme = README.replace("-->1.28<!--", "-->1.36<!--")
    assert ri.problems(checkout(tmp_path, readme=readme)) == [
        "README.md:5: speedup shows '1.36', the index '1.28'"
    ]


def test_a_spread_marker_that_disagrees_fails(tmp_path: Path) -> None:
    readme = README.replace("1.16–1.42", "1.10–1.42")
    assert ri.problems(checkout(tmp_path, readme=readme)) == [
        "README.md:6: speedup:spread shows '1.10–1.42', the index '1.16–1.42'"
    ]


def test_a_marker_of_no_entry_and_an_entry_on_no_page_fail(tmp_path: Path) -> None:
    readme = README.replace("r:speedup -->", "r:speedup_old -->")
    found = ri.problems(checkout(tmp_path, readme=readme))
    assert "README.md:5: marker 'speedup_old' is in no index entry" in found
    assert "speedup: on no page (drop the entry or show it)" not in found  # the spread is
    readme = readme.replace("r:speedup:spread", "r:speedup_old:spread")
    assert "speedup: on no page (drop the entry or show it)" in ri.problems(
        checkout(tmp_path / "2", readme=readme)
    )


def test_a_marker_at_the_start_of_a_line_fails_because_markdown_breaks_the_paragraph(
    tmp_path: Path,
) -> None:
    html = markdown.markdown("Flex is\n<!-- r:x -->1.28<!-- /r -->× sync.")
    assert html.count("<p>") == 2  # the reason for the check: the paragraph is cut in two
    assert markdown.markdown("Flex is **<!-- r:x -->1.28<!-- /r -->×** sync.").count("<p>") == 1
    readme = README.replace("(repeats\n  span <!--", "(repeats\n  <!--")
    assert ri.problems(checkout(tmp_path, readme=readme)) == [
        "README.md:6: marker speedup:spread begins a line: Python-Markdown takes it for a block "
        "comment and breaks the paragraph; rewrap the line"
    ]


def test_good_news_without_its_bad_news_in_one_bullet_fails(tmp_path: Path) -> None:
    bad = {**ENTRY, "id": "pass_rate", "key": "w.wall_s", "fmt": ".1f", "shown": "9.5"}
    bad = {k: v for k, v in bad.items() if not k.startswith("spread")}
    good = {**ENTRY, "shown_with": ["pass_rate"]}
    together = README.replace(
        "sync (repeats", "sync, pass rate <!-- r:pass_rate -->9.5<!-- /r --> (repeats"
    )
    assert ri.problems(checkout(tmp_path, entries=[good, bad], readme=together)) == []
    apart = README.replace(
        "## Other\n", "- and the pass rate <!-- r:pass_rate -->9.5<!-- /r -->.\n\n## Other\n"
    )
    found = ri.problems(checkout(tmp_path / "2", entries=[good, bad], readme=apart))
    assert len(found) == 1 and found[0].startswith(
        "README.md: speedup stands without pass_rate (its bad news) in '- flex is"
    )


def test_render_writes_the_index_and_the_pages_from_the_json(tmp_path: Path) -> None:
    result = {**RESULT, "date": "2026-12-08", "w": {**RESULT["w"], "speedup": 1.355}}
    root = checkout(tmp_path, files={"toy.json": result})
    assert ri.problems(root) == [
        "speedup (bench/results/toy.json w.speedup): the index says shown '1.28', the JSON '1.36'",
        "speedup (bench/results/toy.json w.speedup): the index says date '2026-12-06', the JSON "
        "'2026-12-08'",
    ]
    changed, failed = ri.render(root)
    assert changed == ["bench/results/index.json", "README.md"] and failed == []
    assert "<!-- r:speedup -->1.36<!-- /r -->" in (root / "README.md").read_text()
    index = ri.load_index(root)
    assert (index.results[0].shown, index.results[0].date) == ("1.36", "2026-12-08")
    assert ri.problems(root) == []


def test_the_table_of_every_entry_is_rendered_and_checked(tmp_path: Path) -> None:
    readme = README + "\n<!-- results-index -->\n<!-- /results-index -->\n"
    root = checkout(tmp_path, readme=readme)
    assert "README.md: the results index table is stale (run render)" in ri.problems(root)
    ri.render(root)
    text = (root / "README.md").read_text()
    assert (
        "| flex over sync | **1.28** | 1.16–1.42 | `bench/toy.py`: `toy.json`, `w.speedup` |"
        in text
    )
    assert ri.problems(root) == []


# ---- (c) the index against its JSON ----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (
            {"file": "bench/results/gone.json"},
            "speedup (bench/results/gone.json w.speedup): gone.json: no such file",
        ),
        (
            {"key": "w.speedup_flex"},
            "speedup (bench/results/toy.json w.speedup_flex): w: no key 'speedup_flex'",
        ),
        (
            {"shown": "1.29"},
            "speedup (bench/results/toy.json w.speedup): the index says shown '1.29', the JSON '1.28'",
        ),
        (
            {"spread": "1.16–1.43"},
            "speedup (bench/results/toy.json w.speedup): the index says spread '1.16–1.43', the "
            "JSON '1.16–1.42'",
        ),
        (
            {"date": "2026-12-05"},
            "speedup (bench/results/toy.json w.speedup): the index says date '2026-12-05', the "
            "JSON '2026-12-06'",
        ),
        (
            {"repeats": 3},
            "speedup (bench/results/toy.json w.speedup): the index says repeats 3, the JSON 2",
        ),
        (
            {"machine": "2-core AMD EPYC VM"},
            "speedup (bench/results/toy.json w.speedup): machine '2-core AMD EPYC VM', but the "
            "JSON ran on Intel",
        ),
        ({"script": "bench/gone.py"}, "speedup: script bench/gone.py does not exist"),
        (
            {"key": "w.sync"},
            "speedup (bench/results/toy.json w.sync): w.sync: 2 values; say how to combine them (agg)",
        ),
    ],
)
def test_an_entry_its_json_disagrees_with_fails(
    tmp_path: Path, change: dict[str, Any], problem: str
) -> None:
    assert problem in ri.problems(checkout(tmp_path, entries=[{**ENTRY, **change}]))


def test_values_are_the_json_s_decimals_rounded_half_up() -> None:
    # 0.6575 as a float is 0.65749999...: Python's own format says 0.657
    assert f"{0.6575:.3f}" == "0.657"
    assert ri.fmt_number(Decimal("0.6575"), ".3f") == "0.658"
    assert ri.fmt_number(Decimal("0.07155"), ".1%") == "7.2%"
    assert ri.fmt_number(Decimal("0.0722"), "+.3f") == "+0.072"
    assert ri.fmt_number(Decimal("-0.031"), "+.2f") == "−0.03"
    assert ri.fmt_number(Decimal(76800), ",.0f") == "76,800"
    assert ri.fmt_number(Decimal(99899136), ".1f", "0.000001") == "99.9"
    assert ri.fmt_range(Decimal("1.0"), Decimal("1.001"), ".2f") == "1.00"
    with pytest.raises(ValueError, match=re.escape("format '.2g'")):
        ri.fmt_number(Decimal(1), ".2g")


def test_key_paths_take_wildcards_slices_alternatives_and_lists() -> None:
    data = json.loads(
        '{"a": {"x": {"v": 1}, "y": {"v": 2}, "z": {"v": 3}}, "s": [{"r": 1}, {"r": 2}, {"r": 4}]}',
        parse_float=Decimal,
    )
    assert [v for _, v in ri.lookup(data, "a.*.v")] == [1, 2, 3]
    assert [p for p, _ in ri.lookup(data, "a.{x,z}.v")] == ["a.x.v", "a.z.v"]
    assert [v for _, v in ri.lookup(data, "s.-2:.r")] == [2, 4]
    assert ri.lookup({"l": [Decimal("0.5"), 1]}, "l") == [("l.0", Decimal("0.5")), ("l.1", 1)]
    with pytest.raises(ri.Missing, match=re.escape("a.x: no key 'w'")):
        ri.lookup(data, "a.x.w")


# ---- (d) one key, one value, among a benchmark's files -----------------------------------------


def test_a_sibling_file_with_another_value_for_the_key_fails(tmp_path: Path) -> None:
    stale = {**RESULT, "w": {**RESULT["w"], "speedup": 1.062}}
    root = checkout(tmp_path, files={"toy.json": RESULT, "toy_latest.json": stale})
    assert ri.problems(root) == [
        "speedup: w.speedup is 1.2834 in bench/results/toy.json but 1.062 in "
        "bench/results/toy_latest.json; one current file per result: delete the superseded file, "
        "list it under `superseded`, or show its value as an entry of its own"
    ]


def test_a_sibling_that_agrees_or_another_benchmark_s_file_is_no_conflict(tmp_path: Path) -> None:
    other = {"w": {"speedup": 0.5}}  # another benchmark's key of the same name
    files = {"toy.json": RESULT, "toy_seed1.json": RESULT, "other.json": other}
    assert ri.problems(checkout(tmp_path, files=files)) == []


def test_a_declared_second_measurement_or_a_superseded_file_passes(tmp_path: Path) -> None:
    seed1 = {**RESULT, "w": {**RESULT["w"], "speedup": 1.1}}
    files = {"toy.json": RESULT, "toy_seed1.json": seed1}
    second = {
        **ENTRY,
        "id": "speedup_seed1",
        "file": "bench/results/toy_seed1.json",
        "shown": "1.10",
        "spread": None,
    }
    second.pop("spread_of")
    readme = README.replace("(repeats", "(seed 1: <!-- r:speedup_seed1 -->1.10<!-- /r -->; repeats")
    assert (
        ri.problems(checkout(tmp_path, files=files, entries=[ENTRY, second], readme=readme)) == []
    )
    kept = {"bench/results/toy_seed1.json": "quoted by docs/x.md"}
    assert ri.problems(checkout(tmp_path / "2", files=files, superseded=kept)) == []
    reads_it = [{**ENTRY, "file": "bench/results/toy_seed1.json", "shown": "1.10"}]
    found = ri.problems(checkout(tmp_path / "3", files=files, superseded=kept, entries=reads_it))
    assert (
        "speedup (bench/results/toy_seed1.json w.speedup): reads a file the index lists as superseded"
        in found
    )


def test_a_superseded_file_that_is_gone_fails(tmp_path: Path) -> None:
    kept = {"bench/results/toy_old.json": "quoted by docs/x.md"}
    assert ri.problems(checkout(tmp_path, superseded=kept)) == [
        "superseded bench/results/toy_old.json: no such file (drop it from the list)"
    ]


def test_check_exits_non_zero_with_its_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = checkout(tmp_path, readme=README.replace("-->1.28<!--", "-->1.36<!--"))
    assert ri.main(["check", "--root", str(root)]) == 1
    assert "speedup shows '1.36', the index '1.28'" in capsys.readouterr().out
    assert ri.main(["render", "--root", str(root)]) == 0
    assert ri.main(["check", "--root", str(root)]) == 0
