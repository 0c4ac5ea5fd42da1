//! How errors and configurations print.

use super::*;

#[derive(Debug)]
pub(super) struct Layer(&'static str, Option<Box<Layer>>);

impl std::fmt::Display for Layer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }
}

impl std::error::Error for Layer {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.1.as_deref().map(|l| l as _)
    }
}

#[test]
pub(super) fn chain_puts_an_error_and_every_cause_on_one_line() {
    let root = Layer("connection reset", None);
    let middle = Layer("reading the reply", Some(Box::new(root)));
    let top = Layer("fetching the head", Some(Box::new(middle)));
    assert_eq!(chain(&top), "fetching the head: reading the reply: connection reset");
    assert_eq!(chain(&Layer("alone", None)), "alone");
    assert_eq!(chain(&io("refused")), "store connection failed: refused");
}

#[test]
pub(super) fn a_config_prints_its_hooks_by_name() {
    let mut config = WorkerConfig::new("w1");
    config.observer = Some(Observer(Rc::new(|_: &WorkerEvent| {})));
    config.start_together = Some(StartTogether::new(2));
    let text = format!("{config:?}");
    assert!(text.contains("observer: Some(Observer)"), "{text}");
    assert!(text.contains("start_together: Some(StartTogether)"), "{text}");
}
