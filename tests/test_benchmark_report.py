"""docs/benchmarks.md is written by several benchmarks: each rewrites its own part and keeps the others'."""

from __future__ import annotations

from benchmarks.report import marked_sections, write_section

OTHERS = "<!-- large:begin -->\n## large\n| a |\n<!-- large:end -->\n\n<!-- eager:begin -->\neager\n<!-- eager:end -->"


def test_the_main_report_keeps_every_marked_section():
    old = "# Benchmarks\n\nold main table\n\n" + OTHERS + "\n"
    assert marked_sections(old) == ["<!-- large:begin -->\n## large\n| a |\n<!-- large:end -->",
                                    "<!-- eager:begin -->\neager\n<!-- eager:end -->"]
    assert marked_sections("no sections here") == []


def test_a_section_is_replaced_in_place_or_appended(tmp_path):
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\n" + OTHERS + "\n")
    write_section(path, "<!-- large:begin -->\nnew\n<!-- large:end -->", "<!-- large:begin -->", "<!-- large:end -->")
    write_section(path, "<!-- compile:begin -->\nc\n<!-- compile:end -->", "<!-- compile:begin -->", "<!-- compile:end -->")
    assert [s.split("\n")[1] for s in marked_sections(path.read_text())] == ["new", "eager", "c"]
