//! Fitting a table's columns to the screen's width without cutting numbers.
//!
//! ratatui shrinks every column of a table that is wider than its area and
//! cuts the cells, so `20.76M` shows as `20.`: a number that lies. Here each
//! column says how wide it must be (at least as wide as its widest cell)
//! and how readily it can go; when the width runs out, whole columns go,
//! least important first, and only text columns (names) give way, cut with
//! a `…` by the caller. Tested at 80×24 by `tests/tests/agent_top.rs`.

use ratatui::layout::Constraint;

/// Spacing between columns (ratatui's default).
pub const SPACING: u16 = 1;

/// One column of a table.
#[derive(Clone, Copy, Debug)]
pub struct Column {
    /// Width it asks for at least.
    pub min: u16,
    /// A text column: takes what is left over and may be cut.
    pub flexible: bool,
    /// 0: always shown; otherwise columns with a higher value go first.
    pub drop: u8,
}

impl Column {
    /// A number column, always shown.
    pub const fn keep(min: u16) -> Self {
        Self {
            min,
            flexible: false,
            drop: 0,
        }
    }

    /// A number column that goes, in order `drop`, when space is short.
    pub const fn optional(min: u16, drop: u8) -> Self {
        Self {
            min,
            flexible: false,
            drop,
        }
    }

    /// A text column that takes the leftover width (at least `min`).
    pub const fn text(min: u16) -> Self {
        Self {
            min,
            flexible: true,
            drop: 0,
        }
    }

    /// A text column that goes, in order `drop`, when space is short.
    pub const fn optional_text(min: u16, drop: u8) -> Self {
        Self {
            min,
            flexible: true,
            drop,
        }
    }
}

/// The columns to show (indices into `columns`) and their constraints,
/// for a table `width` cells wide whose cells (header included) are
/// `cells`, one `Vec` per row.
pub fn fit(columns: &[Column], cells: &[Vec<String>], width: u16) -> (Vec<usize>, Vec<Constraint>) {
    let widths: Vec<u16> = columns
        .iter()
        .enumerate()
        .map(|(index, column)| {
            if column.flexible {
                return column.min;
            }
            let widest = cells
                .iter()
                .filter_map(|row| row.get(index))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0);
            column.min.max(u16::try_from(widest).unwrap_or(u16::MAX))
        })
        .collect();
    let mut kept: Vec<usize> = (0..columns.len()).collect();
    let total = |kept: &[usize]| -> u32 {
        kept.iter().map(|&i| u32::from(widths[i])).sum::<u32>()
            + u32::from(SPACING) * kept.len().saturating_sub(1) as u32
    };
    while total(&kept) > u32::from(width) {
        let Some(position) = kept
            .iter()
            .enumerate()
            .filter(|(_, i)| columns[**i].drop > 0)
            .max_by_key(|(position, i)| (columns[**i].drop, *position))
            .map(|(position, _)| position)
        else {
            break;
        };
        kept.remove(position);
    }
    let constraints = kept
        .iter()
        .map(|&i| {
            if columns[i].flexible {
                Constraint::Min(widths[i])
            } else {
                Constraint::Length(widths[i])
            }
        })
        .collect();
    (kept, constraints)
}

/// `row` with only the cells at `kept`.
pub fn pick<T: Clone>(row: &[T], kept: &[usize]) -> Vec<T> {
    kept.iter().filter_map(|&i| row.get(i).cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cells(rows: &[&[&str]]) -> Vec<Vec<String>> {
        rows.iter()
            .map(|r| r.iter().map(|c| c.to_string()).collect())
            .collect()
    }

    #[test]
    fn everything_fits_when_wide_enough() {
        let columns = [Column::text(5), Column::keep(4), Column::optional(4, 1)];
        let (kept, constraints) = fit(
            &columns,
            &cells(&[&["name", "ops/s", "drops"], &["x", "20.76M", "3"]]),
            40,
        );
        assert_eq!(kept, vec![0, 1, 2]);
        assert_eq!(
            constraints,
            vec![Constraint::Min(5), Constraint::Length(6), Constraint::Length(5)],
            "number columns as wide as their widest cell"
        );
    }

    #[test]
    fn narrow_drops_whole_columns_most_droppable_first_never_cuts_numbers() {
        let columns = [
            Column::text(6),
            Column::keep(6),
            Column::optional(6, 1),
            Column::optional(6, 2),
        ];
        let rows = cells(&[
            &["instance", "ops/s", "ops", "drops"],
            &["a", "20.76M", "1.23M", "12"],
        ]);
        // 6 + 6 + 6 + 6 + 3 spaces = 27: at 20, the drop-2 column goes.
        let (kept, constraints) = fit(&columns, &rows, 20);
        assert_eq!(kept, vec![0, 1, 2]);
        assert_eq!(constraints[1], Constraint::Length(6));
        // At 13 the drop-1 column goes too, and nothing else can.
        assert_eq!(fit(&columns, &rows, 13).0, vec![0, 1]);
        assert_eq!(fit(&columns, &rows, 3).0, vec![0, 1]);
        assert_eq!(
            pick(&rows[1], &[0, 1]),
            vec!["a".to_string(), "20.76M".to_string()]
        );
    }
}
