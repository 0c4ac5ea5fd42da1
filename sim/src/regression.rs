//! Saved cases: a scenario, a seed and the violations its replay must report. `cargo test`
//! replays every file in `testdata/regressions/`, so a fixed bug stays fixed and a known-bad
//! design stays caught.

use keyorder::check::Kind;
use serde::{Deserialize, Serialize};

use crate::scenario::{Scenario, ScenarioError};

/// One saved case.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Regression {
    /// A short name.
    pub name: String,
    /// What the case shows and why it is kept.
    pub why: String,
    /// The seed to replay.
    pub seed: u64,
    /// The violation kinds the replay must report: empty for a case that must pass.
    pub expect: Vec<Kind>,
    /// The scenario.
    pub scenario: Scenario,
}

impl Regression {
    /// Parses and validates a saved case.
    pub fn from_json(text: &str) -> Result<Self, ScenarioError> {
        let case: Regression = serde_json::from_str(text)?;
        case.scenario.validate()?;
        Ok(case)
    }
}

/// A scenario file's contents: a bare scenario, or a saved case (whose seed is a default).
pub fn load_scenario(text: &str) -> Result<(Scenario, Option<u64>), ScenarioError> {
    let value: serde_json::Value = serde_json::from_str(text)?;
    if value.get("scenario").is_some() {
        let case = Regression::from_json(text)?;
        Ok((case.scenario, Some(case.seed)))
    } else {
        Scenario::from_json(text).map(|s| (s, None))
    }
}
