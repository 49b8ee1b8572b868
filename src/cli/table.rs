//! What commands print: aligned tables and pretty JSON.

pub(super) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

/// Renders rows as left-aligned columns.
pub(super) fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let n = cells.len();
        for (i, (c, w)) in cells.into_iter().zip(&widths).enumerate() {
            if i + 1 == n {
                out.push_str(&c);
            } else {
                out.push_str(&format!("{c:<w$}  ", w = *w));
            }
        }
        out.push('\n');
    };
    line(header.iter().map(|s| s.to_string()).collect(), &mut out);
    for r in rows {
        line(r, &mut out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(&["A", "BB"], vec![vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
    }
}
