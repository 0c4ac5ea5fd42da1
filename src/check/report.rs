//! The verdict as a human table.

use std::fmt;

use super::Verdict;

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let violations = self.violations();
        if violations == 0 {
            writeln!(
                f,
                "verdict: OK ({} events, {} deliveries, {} dead-lettered)",
                self.events, self.deliveries, self.dead_lettered
            )?;
        } else {
            writeln!(
                f,
                "verdict: VIOLATED ({violations} violations; {} events, {} deliveries)",
                self.events, self.deliveries
            )?;
        }
        writeln!(f, "{:<16} {:<10} {:>7}  first counterexample", "kind", "class", "count")?;
        for finding in &self.findings {
            if self.not_judged.contains(&finding.kind) {
                writeln!(f, "{:<16} {:<10} {:>7}  -", finding.kind.name(), "not judged", "-")?;
                continue;
            }
            let class = if finding.kind.is_violation() { "violation" } else { "counted" };
            let first = finding
                .first
                .as_ref()
                .map_or_else(|| "-".to_owned(), |c| format!("key {:?}: {}", c.key, c.note));
            writeln!(
                f,
                "{:<16} {:<10} {:>7}  {}",
                finding.kind.name(),
                class,
                finding.count,
                first
            )?;
        }
        Ok(())
    }
}
