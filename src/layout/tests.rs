use super::*;

fn count(n: i64) -> PartitionCount {
    PartitionCount::new(n).expect("valid count")
}

fn state(counts: &[(i32, i64)], pins: Vec<PinSpan>) -> RoutingState {
    RoutingState {
        layouts: counts
            .iter()
            .map(|&(epoch, n)| LayoutRecord { epoch, partitions: count(n) })
            .collect(),
        pins,
    }
}

fn placed(key: &str, partition: i16, layout: i32, rows: i64) -> Placement {
    Placement { key: key.into(), partition, layout, rows }
}

fn on(key: &str, n: i64) -> i16 {
    crate::routing::partition_for(key, count(n)).0 as i16
}

#[test]
fn rows_where_routing_puts_them_are_clean() {
    let s = state(&[(0, 16)], vec![]);
    let rows: Vec<Placement> =
        (0..40).map(|i| format!("sub_{i}")).map(|k| placed(&k, on(&k, 16), 0, 3)).collect();
    let a = audit(&s, &rows);
    assert!(a.is_clean(), "{a:?}");
    assert_eq!(a.summary(), None);
}

#[test]
fn a_producer_with_another_count_strands_and_misroutes() {
    // Routed with 24 while 16 is in force: rows on 16..23 are stranded, the rest mostly
    // misrouted. (With 64, a multiple of 16, the rows below 16 would all be where 16 puts
    // them: the digest mod 64 is below 16 only when it equals the digest mod 16.)
    let s = state(&[(0, 16)], vec![]);
    let keys: Vec<String> = (0..200).map(|i| format!("sub_{i}")).collect();
    let rows: Vec<Placement> = keys.iter().map(|k| placed(k, on(k, 24), 0, 1)).collect();
    let a = audit(&s, &rows);
    let stranded = keys.iter().filter(|k| on(k, 24) >= 16).count() as i64;
    let misrouted = keys.iter().filter(|k| on(k, 24) < 16 && on(k, 24) != on(k, 16)).count() as i64;
    assert!(stranded > 40 && misrouted > 40, "{stranded} {misrouted}");
    assert_eq!(a.stranded_rows, stranded);
    assert_eq!(a.misrouted_rows, misrouted);
    assert_eq!(a.stranded_keys.len(), AUDIT_EXAMPLES);
    let text = a.summary().expect("not clean");
    assert!(text.contains("no worker reads") && text.contains("another count"), "{text}");
}

#[test]
fn a_pin_routes_its_epochs_and_only_those() {
    let key = "whale";
    let hashed = on(key, 8);
    let pinned = (hashed + 1) % 8;
    let pin = PinSpan {
        key: key.into(),
        partition: PartitionId(pinned as u16),
        from_epoch: 1,
        until_epoch: Some(2),
    };
    let s = state(&[(0, 8), (1, 8), (2, 8)], vec![pin]);
    // Before the pin and after the unpin the hash routes; under it, the pin.
    let good = [placed(key, hashed, 0, 1), placed(key, pinned, 1, 1), placed(key, hashed, 2, 1)];
    assert!(audit(&s, &good).is_clean());
    let bad = [placed(key, hashed, 1, 4)];
    let a = audit(&s, &bad);
    assert_eq!(a.misrouted_rows, 4);
    assert_eq!(a.misrouted_keys, vec![(key.to_owned(), hashed, pinned as u16)]);
    assert_eq!(s.current_pins().len(), 0);
    assert_eq!(s.router_at(1).expect("epoch 1").route(key).0, pinned as u16);
}

#[test]
fn rows_of_an_older_layout_are_judged_by_its_count() {
    // A switch from 4 to 8: old rows by 4, new by 8; workers lease 8 meanwhile.
    let s = state(&[(0, 4), (1, 8)], vec![]);
    let rows = [placed("a", on("a", 4), 0, 2), placed("a", on("a", 8), 1, 2)];
    assert!(audit(&s, &rows).is_clean());
    let swapped = [placed("a", on("a", 8), 0, 2)];
    if on("a", 8) != on("a", 4) {
        assert_eq!(audit(&s, &swapped).misrouted_rows, 2);
    }
}

#[test]
fn the_count_of_an_unrecorded_queue_is_inferred_when_unique() {
    let keys: Vec<String> = (0..60).map(|i| format!("sub_{i}")).collect();
    for n in [1, 16, 64, 1000] {
        let rows: Vec<(String, i16)> = keys.iter().map(|k| (k.clone(), on(k, n))).collect();
        let want = Inference::Unique(count(n));
        assert_eq!(infer_count(&rows), want, "count {n}");
    }
    assert_eq!(infer_count(&[]), Inference::Empty);
}

#[test]
fn too_few_keys_are_ambiguous_and_a_random_hash_fits_no_count() {
    let one = vec![("sub_1".to_owned(), on("sub_1", 16))];
    match infer_count(&one) {
        Inference::Ambiguous(some) => assert!(some.len() == AUDIT_EXAMPLES, "{some:?}"),
        other => panic!("{other:?}"),
    }
    // Partitions that no single count explains: each key on the partition after its own.
    let rows: Vec<(String, i16)> =
        (0..60).map(|i| format!("sub_{i}")).map(|k| (k.clone(), (on(&k, 16) + 1) % 16)).collect();
    assert_eq!(infer_count(&rows), Inference::None);
}

#[test]
fn a_pin_is_refused_for_an_empty_key_or_a_partition_outside_the_count() {
    let c = count(8);
    assert_eq!(check_pin("whale", Some(PartitionId(7)), c), Ok(()));
    assert_eq!(check_pin("whale", Some(PartitionId(0)), c), Ok(()));
    assert_eq!(check_pin("whale", None, c), Ok(()), "unpinning needs no partition");
    let err = check_pin("whale", Some(PartitionId(8)), c).unwrap_err();
    assert!(err.contains("partition 8 does not exist") && err.contains("partitions 0..7"), "{err}");
    assert_eq!(check_pin("", Some(PartitionId(1)), c), Err("the key is empty".into()));
    assert_eq!(check_pin("", None, c), Err("the key is empty".into()));
}

#[test]
fn after_a_switch_down_workers_lease_the_older_larger_count_while_its_rows_remain() {
    // From 8 partitions (epoch 0) down to 4 (epoch 1): rows of epoch 0 on partitions 4..7 are
    // still leased, and so are not stranded, until they drain.
    let s = state(&[(0, 8), (1, 4)], vec![]);
    let key = (0..100).map(|i| format!("sub_{i}")).find(|k| on(k, 8) >= 4).expect("a key");
    let rows = [placed(&key, on(&key, 8), 0, 3)];
    assert_eq!(s.leased_count(&rows), Some(count(8)));
    assert!(audit(&s, &rows).is_clean(), "{:?}", audit(&s, &rows));
    // A row of epoch 1 is judged by 4, and with only such rows 4 are leased.
    let newer = [placed(&key, on(&key, 4), 1, 1)];
    assert_eq!(s.leased_count(&newer), Some(count(4)));
    assert!(audit(&s, &newer).is_clean());
    // A layout recorded from epoch 2 judges rows of epoch 2 and later, not epoch 1's.
    let s = state(&[(0, 4), (2, 8)], vec![]);
    let rows = [placed(&key, on(&key, 4), 1, 1)];
    assert!(audit(&s, &rows).is_clean(), "epoch 1 is still under the count of epoch 0");
}

#[test]
fn the_edges_of_the_leased_partitions_and_each_finding_on_its_own() {
    let s = state(&[(0, 16)], vec![]);
    let key_on =
        |p: i16| (0..1000).map(|i| format!("k{i}")).find(|k| on(k, 16) == p).expect("a key on p");
    // Partitions 0 and 15 are leased; 16 and -1 are not.
    let (first, last) = (key_on(0), key_on(15));
    assert!(audit(&s, &[placed(&first, 0, 0, 1), placed(&last, 15, 0, 1)]).is_clean());
    let a = audit(&s, &[placed(&first, 16, 0, 2), placed(&last, -1, 0, 3)]);
    assert_eq!((a.stranded_rows, a.misrouted_rows), (5, 0));
    assert!(!a.is_clean());
    let text = a.summary().expect("stranded");
    assert!(text.contains("5 rows on partitions no worker reads"), "{text}");
    assert!(!text.contains("another count"), "{text}");
    // Only misrouted: not clean either, and said alone.
    let a = audit(&s, &[placed(&first, 15, 0, 2)]);
    assert_eq!((a.stranded_rows, a.misrouted_rows), (0, 2));
    assert!(!a.is_clean());
    assert_eq!(a.misrouted_keys, vec![(first.clone(), 15, 0)]);
    let text = a.summary().expect("misrouted");
    assert!(text.starts_with("2 rows not where their key routes"), "{text}");
    // At most AUDIT_EXAMPLES keys are named of each kind.
    let many: Vec<Placement> = (0..20)
        .map(|i| format!("m{i}"))
        .map(|k| {
            let wrong = (on(&k, 16) + 1) % 16;
            placed(&k, wrong, 0, 1)
        })
        .collect();
    let a = audit(&s, &many);
    assert_eq!((a.misrouted_rows, a.misrouted_keys.len()), (20, AUDIT_EXAMPLES));
}

#[test]
fn only_open_pins_are_in_force_now() {
    let span = |key: &str, partition: u16, until_epoch| PinSpan {
        key: key.into(),
        partition: PartitionId(partition),
        from_epoch: 1,
        until_epoch,
    };
    let s =
        state(&[(0, 8), (1, 8), (2, 8)], vec![span("closed", 3, Some(2)), span("open", 5, None)]);
    let pins = s.current_pins();
    assert_eq!(pins.len(), 1, "the closed pin is history");
    assert_eq!(pins.lookup("open"), Some(PartitionId(5)));
    assert_eq!(pins.lookup("closed"), None);
}

#[test]
fn a_pin_outside_the_new_count_names_the_key_its_partition_and_the_way_out() {
    let text = pin_outside("whale", 40, count(16));
    assert_eq!(
        text,
        "key \"whale\" is pinned to partition 40, which 16 partitions do not have: \
         `keyorder unpin whale` (or pin it below 16) first"
    );
}
