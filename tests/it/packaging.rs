//! Every example config shipped in `packaging/` parses, and means what the daemon expects.

use std::path::Path;

use switchyard::config::Config;

#[test]
fn every_example_config_in_packaging_parses() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging");
    let mut found = 0;
    let mut stack = vec![dir];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let p = entry.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "toml") {
                let text = std::fs::read_to_string(&p).unwrap();
                Config::parse(&text, &p).unwrap_or_else(|e| panic!("{e}"));
                found += 1;
            }
        }
    }
    assert!(found >= 1, "no example config found in packaging/");
}

#[test]
fn the_packaged_config_names_the_systemd_directories() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/switchyard.toml");
    let c = Config::parse(&std::fs::read_to_string(&p).unwrap(), &p).unwrap();
    assert_eq!(
        c.storage.state_dir.as_deref(),
        Some(Path::new("/var/lib/switchyard"))
    );
    assert_eq!(
        c.admin.socket.as_deref(),
        Some(Path::new("/run/switchyard/admin.sock"))
    );
}

#[test]
fn the_systemd_unit_is_hardened_and_notifies() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd/switchyard.service");
    let unit = std::fs::read_to_string(p).unwrap();
    for line in [
        "Type=notify",
        "DynamicUser=yes",
        "StateDirectory=switchyard",
        "RuntimeDirectory=switchyard",
        "ProtectSystem=strict",
        "CapabilityBoundingSet=",
        "NoNewPrivileges=yes",
        "MemoryDenyWriteExecute=yes",
        "Restart=on-failure",
    ] {
        assert!(
            unit.lines()
                .any(|l| l.trim() == line || l.trim().starts_with(&format!("{line} "))),
            "unit lacks `{line}`"
        );
    }
    assert!(unit.lines().any(|l| l.starts_with("WatchdogSec=")));
    assert!(unit.contains("systemctl edit"));
}

#[test]
fn the_socket_unit_hands_over_the_default_listener_by_name() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/systemd");
    let socket = std::fs::read_to_string(dir.join("switchyard.socket")).unwrap();
    let value = |key: &str| {
        socket
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("{key}=")))
            .map(str::to_string)
    };
    assert_eq!(
        value("ListenStream").as_deref(),
        Some(switchyard::config::DEFAULT_LISTEN)
    );
    assert_eq!(
        value("FileDescriptorName").as_deref(),
        Some(switchyard::daemon::systemd::LISTENER_NAME)
    );
    let service = std::fs::read_to_string(dir.join("switchyard.service")).unwrap();
    assert!(
        service
            .lines()
            .any(|l| l.starts_with("ExecReload=") && l.ends_with(" reload")),
        "the service reloads through `switchyard reload`"
    );
}

#[test]
fn the_debian_package_ships_units_and_config_and_never_starts_the_service() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Value =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let deb = &manifest["package"]["metadata"]["deb"];
    let assets: Vec<(String, String)> = deb["assets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            (
                a[0].as_str().unwrap().to_string(),
                a[1].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(assets.contains(&("target/release/switchyard".into(), "usr/bin/".into())));
    assert!(assets.contains(&(
        "packaging/switchyard.toml".into(),
        "etc/switchyard/switchyard.toml".into()
    )));
    assert_eq!(
        deb["conf-files"].as_array().unwrap()[0].as_str(),
        Some("/etc/switchyard/switchyard.toml")
    );
    let units = &deb["systemd-units"];
    assert_eq!(units["unit-scripts"].as_str(), Some("packaging/systemd"));
    assert_eq!(units["enable"].as_bool(), Some(false));
    assert_eq!(units["start"].as_bool(), Some(false));
    let scripts = root.join(deb["maintainer-scripts"].as_str().unwrap());
    let postinst = std::fs::read_to_string(scripts.join("postinst")).unwrap();
    assert!(postinst.contains("#DEBHELPER#") && postinst.contains("daemon-reload"));
    for script in ["postinst", "prerm", "postrm"] {
        let text = std::fs::read_to_string(scripts.join(script)).unwrap();
        assert!(text.contains("#DEBHELPER#"), "{script}");
        assert!(
            !text.contains("systemctl start") && !text.contains("systemctl restart"),
            "{script} starts the service"
        );
    }
    // The unit runs the packaged binary; install.sh rewrites the path to its own.
    let unit = std::fs::read_to_string(root.join("packaging/systemd/switchyard.service")).unwrap();
    assert!(unit.contains("ExecStart=/usr/bin/switchyard "), "{unit}");
    let script = std::fs::read_to_string(root.join("packaging/install.sh")).unwrap();
    assert!(script.contains("s#/usr/bin/switchyard#/usr/local/bin/switchyard#g"));
}

#[path = "../../link/script.rs"]
mod hot_layout;

#[test]
fn the_hot_layout_takes_each_listed_name_in_order_and_leaves_out_what_it_would_misread() {
    let list = "_ZN10switchyard4base9json_scan4Scan11string_here\n\
                \n\
                mi_free\n\
                _RNvNtNtCs*_4core3str8converts9from_utf8\n\
                bad) name\n\
                /DISCARD/ : { *(.text) }\n\
                \t_ZN5hyper5proto2h14conn4Conn2go  \n";
    let script = hot_layout::linker_script(list);
    let patterns: Vec<&str> = script
        .lines()
        .filter(|l| l.contains("*("))
        .map(str::trim)
        .collect();
    assert_eq!(
        patterns,
        [
            "*(.text._ZN10switchyard4base9json_scan4Scan11string_here17h*)",
            "*(.text.mi_free)",
            "*(.text._RNvNtNtCs*_4core3str8converts9from_utf8)",
            "*(.text._ZN5hyper5proto2h14conn4Conn2go17h*)",
        ]
    );
    // One `.text`, placed where the linker's own layout has it, nothing discarded.
    assert!(script.starts_with("SECTIONS {\n  .text : {\n"));
    assert!(script.ends_with("  }\n}\nINSERT BEFORE .init;\n"));
    assert!(!script.contains("DISCARD"));
}

#[test]
fn the_committed_hot_list_is_all_taken() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("link/hot-functions.txt");
    let list = std::fs::read_to_string(&p).unwrap();
    let names = list.lines().filter(|l| !l.trim().is_empty()).count();
    let script = hot_layout::linker_script(&list);
    assert!(names > 100, "{names} names in {}", p.display());
    assert_eq!(
        script.matches("*(.text.").count(),
        names,
        "a listed name would be skipped"
    );
}
