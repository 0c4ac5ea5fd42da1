//! The SQLite file must be on a file system of this host. Two rules depend on it: SQLite's own
//! locking (which file systems shared between hosts do not keep, so two writers can corrupt the
//! file) and the lease clock ([`super::lease_clock`], the host's monotonic clock: processes on
//! two hosts would judge each other's leases by clocks that have nothing in common). Opening a
//! database therefore refuses a folder on a network or cluster file system, named by the
//! `statfs` magic number Linux reports for it.

use std::path::Path;

/// The network and cluster file systems refused, by `statfs` magic number (Linux's
/// `include/uapi/linux/magic.h` and the file systems' own sources). FUSE is not among them:
/// it is local as often as not.
const SHARED: &[(u64, &str)] = &[
    (0x6969, "NFS"),
    (0x517b, "SMB"),
    (0xff53_4d42, "CIFS"),
    (0xfe53_4d42, "SMB2"),
    (0x00c3_6400, "Ceph"),
    (0x5346_414f, "AFS"),
    (0x6b41_4653, "AFS"),
    (0x0102_1997, "9P"),
    (0x7375_7245, "Coda"),
    (0x564c, "NCP"),
    (0x7461_636f, "OCFS2"),
    (0x0116_1970, "GFS2"),
    (0x0bd0_0bd0, "Lustre"),
    (0x4750_4653, "GPFS"),
];

/// The name of the shared file system with `statfs` magic `magic`, if it is one.
pub fn shared_file_system(magic: u64) -> Option<&'static str> {
    SHARED.iter().find(|(m, _)| *m == magic).map(|(_, name)| *name)
}

/// The shared file system `dir` lies on, if it does; `None` for a local one, and where it
/// cannot be told (not Linux, or `statfs` failed: opening the file then reports what is wrong).
pub fn shared_file_system_of(dir: &Path) -> Option<&'static str> {
    #[cfg(target_os = "linux")]
    {
        let magic = rustix::fs::statfs(dir).ok()?.f_type;
        // The magic is a 32-bit number the kernel stores in a signed word: as unsigned 32 bits.
        shared_file_system(u64::from(magic as u32))
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_and_cluster_file_systems_are_named_and_local_ones_are_not() {
        assert_eq!(shared_file_system(0x6969), Some("NFS"));
        assert_eq!(shared_file_system(0xff53_4d42), Some("CIFS"));
        assert_eq!(shared_file_system(0x0102_1997), Some("9P"));
        // ext4, XFS, btrfs, tmpfs, overlayfs, FUSE.
        for local in [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994, 0x794c_7630, 0x6573_5546] {
            assert_eq!(shared_file_system(local), None, "{local:#x}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn the_folders_tests_write_to_are_local() {
        assert_eq!(shared_file_system_of(&std::env::temp_dir()), None);
        assert_eq!(shared_file_system_of(Path::new(".")), None);
    }
}
