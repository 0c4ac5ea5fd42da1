//! A repartition plan run with the operator's key sample: drain-and-switch and the online
//! procedure keep the contract, the flip without drain breaks it, on the same keys and seeds.

use std::fs::File;
use std::io::BufReader;

use keyorder::PartitionCount;
use keyorder_sim::rehearsal::{compare, KeySample};
use keyorder_sim::scenario::Procedure;

#[test]
fn safe_procedures_pass_and_the_flip_fails_on_the_same_keys() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../testdata/keys_100k.csv");
    let sample =
        KeySample::read(BufReader::new(File::open(path).expect("sample")), 1).expect("parses");
    assert_eq!(sample.read, 100_000);
    let keys = sample.keys();
    let (from, to) = (PartitionCount::new(16).unwrap(), PartitionCount::new(17).unwrap());
    for seed in 0..2 {
        let runs = compare(from, to, Some(&keys), seed).expect("runs");
        for r in &runs {
            match r.procedure {
                Procedure::DrainAndSwitch | Procedure::Online => {
                    assert!(
                        r.violations.is_empty(),
                        "seed {seed} {:?}: {:?}",
                        r.procedure,
                        r.violations
                    )
                }
                Procedure::FlipWithoutDrain => {
                    assert!(
                        r.violations.contains_key("split_key"),
                        "seed {seed}: the flip was not caught: {:?}",
                        r.violations
                    )
                }
            }
            assert!(r.switched, "seed {seed} {:?} did not switch", r.procedure);
        }
        let pause = |p| runs.iter().find(|r| r.procedure == p).map(|r| r.write_pause_ms);
        assert!(pause(Procedure::DrainAndSwitch) > Some(0), "drain-and-switch pauses writes");
        assert_eq!(pause(Procedure::Online), Some(0), "the online procedure does not");
    }
}
