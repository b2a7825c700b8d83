//! A host of the test's own, on this machine: a Linux network namespace joined to the machine
//! by veth links, for faults a loopback proxy cannot make. [`Link::cut`] takes the host's end
//! of a link down and closes nothing: what the machine sends over it is dropped on the way (its
//! interface stays up, as when the network beyond a server's own port fails), and the host's
//! packets find no route. A partition as the two ends of a real network see it: a server's
//! TCP keepalives and retransmissions go unanswered; the host's open connections hang and its
//! new ones fail at once. (Taking the machine's end down instead would make the server's own
//! sends fail locally, which TCP never counts against a connection.) A process joins the host
//! through [`NetworkHost::launcher`].
//!
//! Needs root (`ip netns`), as the private servers do; the test fails, never skips, without it.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::util::running_as_root;

/// Run `ip <args>`, which must succeed.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| {
        panic!(
            "running `ip {}`: {e} (iproute2 is required)",
            args.join(" ")
        )
    });
    assert!(
        out.status.success(),
        "`ip {}` failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// See the module's documentation. Deleted, with its links, on drop.
#[derive(Debug)]
pub struct NetworkHost {
    name: String,
    /// The second octet of the host's addresses: `10.<net>.<link>.{1,2}`.
    net: u8,
    links: AtomicU8,
}

/// A veth link between the machine and a [`NetworkHost`].
#[derive(Debug, Clone)]
pub struct Link {
    /// The machine's end: servers the host reaches listen here.
    pub machine: Ipv4Addr,
    /// The host's end (its interface is `device`, in namespace `netns`).
    pub host: Ipv4Addr,
    netns: String,
    device: String,
}

impl NetworkHost {
    /// A new namespace with its loopback up and no links yet.
    pub fn create() -> Self {
        assert!(
            running_as_root(),
            "this test makes a network namespace (`ip netns add`), which needs root"
        );
        // The namespace's name carries the second octet of its addresses, and `ip netns add`
        // fails when the name is taken: the first name it creates claims that octet, so
        // concurrent tests (and namespaces a killed test left behind) never share addresses.
        let start = std::process::id() % 150;
        let (name, net) = (0..150)
            .map(|i| 100 + ((start + i) % 150) as u8)
            .find_map(|net| {
                let name = format!("obx{net}");
                let added = Command::new("ip")
                    .args(["netns", "add", &name])
                    .output()
                    .is_ok_and(|out| out.status.success());
                added.then_some((name, net))
            })
            .expect("`ip netns add` failed for every name obx100..obx249 (is iproute2 there?)");
        ip(&["-n", &name, "link", "set", "lo", "up"]);
        Self {
            name,
            net,
            links: AtomicU8::new(0),
        }
    }

    /// A new link: `10.<net>.<n>.1` on the machine, `10.<net>.<n>.2` on the host.
    pub fn link(&self) -> Link {
        let n = self.links.fetch_add(1, Ordering::Relaxed);
        let [machine, host] = [1, 2].map(|last| Ipv4Addr::new(10, self.net, n, last));
        // Interface names have at most 15 characters.
        let device = format!("ob{}l{n}", self.name.trim_start_matches("obx"));
        let guest = format!("{device}g");
        ip(&[
            "link", "add", &device, "type", "veth", "peer", "name", &guest,
        ]);
        ip(&["link", "set", &guest, "netns", &self.name]);
        ip(&["addr", "add", &format!("{machine}/30"), "dev", &device]);
        ip(&["link", "set", &device, "up"]);
        let netns = ["-n", self.name.as_str()];
        ip(&[
            &netns[..],
            &["addr", "add", &format!("{host}/30"), "dev", &guest],
        ]
        .concat());
        ip(&[&netns[..], &["link", "set", &guest, "up"]].concat());
        Link {
            machine,
            host,
            netns: self.name.clone(),
            device: guest,
        }
    }

    /// A script in `dir` that runs `binary` (with its arguments) on this host: give it where a
    /// binary is asked for. The process keeps the script's pid, so signals reach it.
    pub fn launcher(&self, dir: &Path, binary: &Path) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(format!("on-{}", self.name));
        std::fs::write(
            &path,
            format!(
                "#!/bin/sh\nexec ip netns exec {} '{}' \"$@\"\n",
                self.name,
                binary.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }
}

impl Drop for NetworkHost {
    fn drop(&mut self) {
        // Deleting the namespace deletes its ends of the links, and the machine's ends with them.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

impl Link {
    /// Take the host's end down: the partition of the module's documentation.
    pub fn cut(&self) {
        ip(&["-n", &self.netns, "link", "set", &self.device, "down"]);
    }

    /// Bring it up again (its address and route come back with it).
    pub fn heal(&self) {
        ip(&["-n", &self.netns, "link", "set", &self.device, "up"]);
    }
}
