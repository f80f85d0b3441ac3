#!/usr/bin/python3
"""Checks scripts/plot-table against hand-written markdown tables: which rows
and columns it draws (counted from the SVG gnuplot writes: one group per line,
titled by the column's header, one point marker per drawn value plus one in
the key), that larger values sit higher on the page, and that bad arguments
are a message and a non-zero exit, not a traceback. Needs gnuplot (Debian's
gnuplot-nox, installed by scripts/setup).

usage: /usr/bin/python3 scripts/test_plot_table.py
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

PLOT_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot-table")
SVG = "{http://www.w3.org/2000/svg}"

DOC = """# Figures

Some text.

| other | table |
|---|---|
| 1 | 2 |

## Batching

| sequences | before tok/s | after tok/s | note |
|---:|---:|---:|---|
| 1 | 50.0 | 70.0 | first |
| 4 | 160 | **240** | x |
| 16 | n/a | 450.5 .. 460 | y |
| all | 9 | 9 | not a number in the x column |

### By model

| model | streams | tok/s | ms |
|---|---:|---:|---:|
| small | 1 | 250 | 3.7 |
| | 8 | 680 | 10.1 |
| | 32 | 880 | 30.4 |
| big | 1 | 43 | 21 |
| | 8 | 136 | 45 |

## Later

| sequences | tok/s |
|---:|---:|
| 1 | 1 |
"""


def lines(svg_path):
    """{title: [(x, y) of each point marker, the key's last]} of a gnuplot SVG."""
    root = ET.parse(svg_path).getroot()
    out = {}
    for g in root.iter(SVG + "g"):
        if not (g.get("id") or "").startswith("gnuplot_plot_"):
            continue
        title = g.find(SVG + "title").text
        pts = []
        for use in g.iter(SVG + "use"):
            m = re.match(r"translate\(([-\d.]+),([-\d.]+)\)", use.get("transform", ""))
            if m:
                pts.append((float(m.group(1)), float(m.group(2))))
        out[title] = pts
    return out


class PlotTable(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.md = os.path.join(self.tmp.name, "t.md")
        with open(self.md, "w", encoding="utf-8") as f:
            f.write(DOC)
        self.svg = os.path.join(self.tmp.name, "p.svg")

    def tearDown(self):
        self.tmp.cleanup()

    def run_pt(self, *args):
        return subprocess.run([sys.executable, PLOT_TABLE, "--out", self.svg, *args],
                              capture_output=True, text=True)

    def test_section_rows_and_values(self):
        p = self.run_pt("--section", "## Batching", self.md, "1", "2-3")
        self.assertEqual(p.returncode, 0, p.stderr)
        got = lines(self.svg)
        self.assertEqual(sorted(got), ["after tok/s", "before tok/s"])
        # 'all' has no number in column 1: 3 rows; 'n/a' leaves before with 2
        # points. Each line also has its marker in the key.
        self.assertEqual(len(got["before tok/s"]) - 1, 2)
        self.assertEqual(len(got["after tok/s"]) - 1, 3)
        after = got["after tok/s"][:3]
        xs = [x for x, _ in after]
        ys = [y for _, y in after]
        self.assertEqual(xs, sorted(xs))             # 1, 4, 16 left to right
        self.assertGreater(ys[0], ys[1])             # 70 below 240 (SVG y grows down)
        self.assertGreater(ys[1], ys[2])             # 240 below 450.5
        before = got["before tok/s"][:2]
        self.assertAlmostEqual(before[0][0], after[0][0], places=1)  # both start at x=1
        self.assertGreater(before[0][1], after[0][1])  # 50 below 70

    def test_where_fills_grouped_cells_down_and_y2(self):
        p = self.run_pt("--section", "### By model", "--where", "1=small", "--y2", "4",
                        "--logx", self.md, "2", "3")
        self.assertEqual(p.returncode, 0, p.stderr)
        got = lines(self.svg)
        self.assertEqual(len(got["tok/s"]) - 1, 3)   # small's rows 1, 8, 32; big's left out
        self.assertEqual(len(got["ms"]) - 1, 3)
        p = self.run_pt("--section", "### By model", "--where", "1=big", self.md, "2", "3")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(len(lines(self.svg)["tok/s"]) - 1, 2)

    def test_titles_replace_headers(self):
        p = self.run_pt("--section", "## Batching", "--titles", "old,new", self.md, "1", "2-3")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(sorted(lines(self.svg)), ["new", "old"])
        p = self.run_pt("--section", "## Batching", "--titles", "one", self.md, "1", "2-3")
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("1 titles for 2 lines", p.stderr)

    def test_log_axis_labels_every_x(self):
        # with --logx every x value is a labelled tic, the last one too
        p = self.run_pt("--section", "## Batching", "--logx", self.md, "1", "3")
        self.assertEqual(p.returncode, 0, p.stderr)
        texts = [t.text.strip() for t in ET.parse(self.svg).getroot().iter(SVG + "tspan") if t.text]
        for want in ["1", "4", "16"]:
            self.assertIn(want, texts)

    def test_first_table_without_section(self):
        p = self.run_pt(self.md, "1", "2")
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(list(lines(self.svg)), ["table"])

    def test_bad_arguments_are_messages(self):
        for args, want in [
            (["--section", "## Nowhere", self.md, "1", "2"], "no heading"),
            (["--section", "## Later", "--table", "2", self.md, "1", "2"], "1 tables"),
            (["--section", "## Batching", self.md, "1", "9"], "column 9"),
            (["--section", "## Batching", self.md, "1", "x"], "not a column"),
            (["--section", "## Batching", "--where", "small", self.md, "1", "2"], "COL=TEXT"),
            (["--section", "## Later", "--where", "1=none", self.md, "1", "2"], "no numeric rows"),
        ]:
            p = self.run_pt(*args)
            self.assertNotEqual(p.returncode, 0, args)
            self.assertIn(want, p.stderr, args)
            self.assertNotIn("Traceback", p.stderr, args)


if __name__ == "__main__":
    unittest.main()
