"""Writing a small labelled CSV file, for the command-line tests (a module of its own: `conftest`
names several files, so `from conftest import ...` would depend on which one pytest loaded last)."""

import csv


def write_csv(path, rows, header=("text", "label"), delimiter=","):
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        w.writerow(header)
        w.writerows(rows)
    return path
