//! One result table and its renderings: aligned text for the terminal, Markdown to paste into a
//! report, CSV for spreadsheets. The JSON form is the table itself, serialised, so every
//! rendering shows the same numbers: each number column carries its decimals, and a rendered cell
//! is exactly the JSON number printed with them.

use std::fmt::Write as _;

use serde::Serialize;

/// Widest aligned text table; a wider one (long text cells) is printed as one block per row.
pub const MAX_TEXT_WIDTH: usize = 200;

/// A column: its name, the unit of its numbers and how many decimals a rendering shows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Column {
    pub name: String,
    /// `ms`, `s`, `%`, `tok/s`, `$/h`, `$`, … or empty for text and plain counts.
    pub unit: &'static str,
    pub decimals: usize,
}

impl Column {
    pub fn text(name: &str) -> Column {
        Column {
            name: name.to_owned(),
            unit: "",
            decimals: 0,
        }
    }

    /// A count or another number without a unit.
    pub fn count(name: &str) -> Column {
        Column::text(name)
    }

    pub fn num(name: &str, unit: &'static str, decimals: usize) -> Column {
        Column {
            name: name.to_owned(),
            unit,
            decimals,
        }
    }

    /// The header as rendered: `TTFT p50 (ms)`.
    pub fn header(&self) -> String {
        if self.unit.is_empty() {
            self.name.clone()
        } else {
            format!("{} ({})", self.name, self.unit)
        }
    }
}

/// One cell: text, a number in the column's unit, or nothing measured (`-`, JSON `null`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Cell {
    Text(String),
    Number(f64),
    Missing,
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        Cell::Text(s.into())
    }

    /// A number, or `Missing` when there is none or it is not finite (JSON has no NaN).
    pub fn num(v: Option<f64>) -> Cell {
        match v {
            Some(v) if v.is_finite() => Cell::Number(v),
            _ => Cell::Missing,
        }
    }

    /// The cell as every rendering prints it.
    pub fn render(&self, column: &Column) -> String {
        match self {
            Cell::Text(s) if s.is_empty() => "-".to_owned(),
            Cell::Text(s) => s.clone(),
            Cell::Number(v) => format!("{:.*}", column.decimals, v),
            Cell::Missing => "-".to_owned(),
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Cell::Number(v) => Some(*v),
            _ => None,
        }
    }
}

/// A result table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Table {
    /// Stable identifier: the CSV file is `<id>.csv`.
    pub id: String,
    pub title: String,
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Cell>>,
    /// What a reader needs to read the numbers right (fits, where a number comes from).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl Table {
    pub fn new(id: &str, title: &str, columns: Vec<Column>) -> Table {
        Table {
            id: id.to_owned(),
            title: title.to_owned(),
            columns,
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    /// Adds a row; numbers are rounded to their column's decimals here, so the JSON holds the
    /// very numbers the other renderings print (any JSON reader gets them back).
    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.columns.len(), "row width of {}", self.id);
        let row = row
            .into_iter()
            .zip(&self.columns)
            .map(|(cell, col)| match cell {
                Cell::Number(v) => {
                    let scale = 10f64.powi(col.decimals as i32);
                    let r = (v * scale).round() / scale;
                    // No `-0.0`: a value that rounds to zero prints as 0.
                    Cell::Number(if r == 0.0 { 0.0 } else { r })
                }
                other => other,
            })
            .collect();
        self.rows.push(row);
    }

    /// Removes the column `name` and its cells, where the table has it.
    pub fn drop_column(&mut self, name: &str) {
        if let Some(i) = self.columns.iter().position(|c| c.name == name) {
            self.columns.remove(i);
            for r in &mut self.rows {
                if i < r.len() {
                    r.remove(i);
                }
            }
        }
    }

    /// A column is aligned as numbers when it has a unit or holds a number.
    fn numeric(&self, column: usize) -> bool {
        !self.columns[column].unit.is_empty()
            || self
                .rows
                .iter()
                .any(|r| matches!(r.get(column), Some(Cell::Number(_))))
    }

    fn rendered(&self) -> Vec<Vec<String>> {
        self.rows
            .iter()
            .map(|r| {
                r.iter()
                    .zip(&self.columns)
                    .map(|(c, col)| c.render(col))
                    .collect()
            })
            .collect()
    }

    /// Aligned text: the title, the header, a rule and the rows; numbers right-aligned, columns
    /// two spaces apart (no cell holds two spaces in a row, so tools can split on them).
    pub fn to_text(&self) -> String {
        let headers: Vec<String> = self.columns.iter().map(Column::header).collect();
        let rows = self.rendered();
        let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let total: usize = widths.iter().sum::<usize>() + 2 * widths.len().saturating_sub(1);
        if total > MAX_TEXT_WIDTH {
            return self.to_text_records(&headers, &rows);
        }
        let numeric: Vec<bool> = (0..self.columns.len()).map(|i| self.numeric(i)).collect();
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = widths[i].saturating_sub(c.chars().count());
                if numeric[i] {
                    s.extend(std::iter::repeat_n(' ', pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    s.extend(std::iter::repeat_n(' ', pad));
                }
            }
            s.trim_end().to_owned()
        };
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title);
        let _ = writeln!(out, "{}", line(&headers));
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        let _ = writeln!(out, "{}", line(&rule));
        for r in &rows {
            let _ = writeln!(out, "{}", line(r));
        }
        if rows.is_empty() {
            let _ = writeln!(out, "(no data)");
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }

    /// A table too wide for a terminal as one block per row: `[n]`, then `column  value` lines.
    fn to_text_records(&self, headers: &[String], rows: &[Vec<String>]) -> String {
        let key = headers.iter().map(|h| h.chars().count()).max().unwrap_or(0);
        let mut out = String::new();
        let _ = writeln!(out, "{}", self.title);
        for (i, r) in rows.iter().enumerate() {
            let _ = writeln!(out, "[{}]", i + 1);
            for (h, c) in headers.iter().zip(r) {
                let pad = key - h.chars().count();
                let _ = writeln!(out, "  {h}{}  {c}", " ".repeat(pad));
            }
        }
        if rows.is_empty() {
            let _ = writeln!(out, "(no data)");
        }
        for n in &self.notes {
            let _ = writeln!(out, "note: {n}");
        }
        out
    }

    /// A Markdown section: `### title`, a pipe table with numbers right-aligned, the notes.
    pub fn to_markdown(&self) -> String {
        let esc = |s: &str| s.replace('|', "\\|");
        let mut out = String::new();
        let _ = writeln!(out, "### {}\n", self.title);
        let headers: Vec<String> = self.columns.iter().map(|c| esc(&c.header())).collect();
        let _ = writeln!(out, "| {} |", headers.join(" | "));
        let aligns: Vec<&str> = (0..self.columns.len())
            .map(|i| if self.numeric(i) { "---:" } else { "---" })
            .collect();
        let _ = writeln!(out, "| {} |", aligns.join(" | "));
        for r in self.rendered() {
            let cells: Vec<String> = r.iter().map(|c| esc(c)).collect();
            let _ = writeln!(out, "| {} |", cells.join(" | "));
        }
        if self.rows.is_empty() {
            let _ = writeln!(out, "\n(no data)");
        }
        for n in &self.notes {
            let _ = writeln!(out, "\n_{}_", esc(n));
        }
        out
    }

    /// CSV (RFC 4180): the header, then the rows; numbers as in the JSON, missing ones empty.
    pub fn to_csv(&self) -> String {
        fn field(s: &str) -> String {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_owned()
            }
        }
        let mut out = String::new();
        let headers: Vec<String> = self.columns.iter().map(|c| field(&c.header())).collect();
        let _ = writeln!(out, "{}", headers.join(","));
        for r in &self.rows {
            let cells: Vec<String> = r
                .iter()
                .map(|c| match c {
                    Cell::Text(s) => field(s),
                    Cell::Number(v) => v.to_string(),
                    Cell::Missing => String::new(),
                })
                .collect();
            let _ = writeln!(out, "{}", cells.join(","));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Table {
        let mut t = Table::new(
            "t",
            "A table",
            vec![Column::text("mode"), Column::num("TTFT p50", "ms", 1)],
        );
        t.push(vec![Cell::text("aggregated"), Cell::num(Some(12.345))]);
        t.push(vec![Cell::text("a|b, \"c\""), Cell::num(None)]);
        t.notes.push("fit: R² = 0.99".into());
        t
    }

    #[test]
    fn text_aligns_numbers_right_and_marks_missing_values() {
        let text = sample().to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "A table");
        assert_eq!(lines[1], "mode        TTFT p50 (ms)");
        assert_eq!(lines[2], "----------  -------------");
        assert_eq!(lines[3], "aggregated           12.3");
        assert_eq!(lines[4], "a|b, \"c\"                -");
        assert_eq!(lines[5], "note: fit: R² = 0.99");
    }

    #[test]
    fn a_table_too_wide_for_a_terminal_prints_one_block_per_row() {
        let mut t = Table::new(
            "q",
            "Questions",
            vec![Column::count("#"), Column::text("finding")],
        );
        t.push(vec![
            Cell::Number(1.0),
            Cell::text("x".repeat(MAX_TEXT_WIDTH)),
        ]);
        let text = t.to_text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "Questions");
        assert_eq!(lines[1], "[1]");
        assert_eq!(lines[2], "  #        1");
        assert_eq!(
            lines[3],
            format!("  finding  {}", "x".repeat(MAX_TEXT_WIDTH))
        );
    }

    #[test]
    fn markdown_escapes_pipes_and_right_aligns_numbers() {
        let md = sample().to_markdown();
        assert!(md.starts_with("### A table\n\n| mode | TTFT p50 (ms) |\n| --- | ---: |\n"));
        assert!(md.contains("| aggregated | 12.3 |"));
        assert!(md.contains("| a\\|b, \"c\" | - |"));
    }

    #[test]
    fn csv_quotes_fields_and_holds_the_printed_numbers() {
        let csv = sample().to_csv();
        assert_eq!(
            csv,
            "mode,TTFT p50 (ms)\naggregated,12.3\n\"a|b, \"\"c\"\"\",\n"
        );
    }

    #[test]
    fn a_dropped_column_leaves_no_cell_behind() {
        let mut t = sample();
        t.drop_column("TTFT p50");
        t.drop_column("not a column");
        assert_eq!(t.columns, vec![Column::text("mode")]);
        assert!(t.rows.iter().all(|r| r.len() == 1));
        assert_eq!(t.to_csv(), "mode\naggregated\n\"a|b, \"\"c\"\"\"\n");
    }

    #[test]
    fn json_cells_are_numbers_strings_or_null() {
        let v = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["rows"][0][1], serde_json::json!(12.3));
        assert_eq!(v["rows"][1][1], serde_json::Value::Null);
        assert_eq!(v["columns"][1]["decimals"], 1);
        assert!(Cell::num(Some(f64::NAN)) == Cell::Missing);
        let mut t = sample();
        t.push(vec![Cell::text("x"), Cell::num(Some(-0.04))]);
        assert_eq!(t.rows[2][1], Cell::Number(0.0));
        assert_eq!(t.rows[2][1].render(&t.columns[1]), "0.0");
    }
}
