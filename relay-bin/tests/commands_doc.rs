//! The README's command reference (the block under *Running it*) cannot drift from the CLI:
//! each line names a command that exists and only flags it takes, and every command and every
//! flag of it is shown.

use std::collections::{BTreeMap, BTreeSet};

use clap::CommandFactory;
use outboxkit_relay::cli::Cli;

/// The lines of the README's command block, without their comments.
fn reference() -> Vec<String> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
    let readme = std::fs::read_to_string(path).expect("reading README.md");
    let block = readme
        .split("\n## Running it\n")
        .nth(1)
        .and_then(|section| section.split("```sh\n").nth(1))
        .and_then(|rest| rest.split("```").next())
        .expect("the README's Running it section starts with a sh block");
    block
        .lines()
        .map(|line| {
            line.split("  #")
                .next()
                .unwrap_or_default()
                .trim()
                .to_owned()
        })
        .filter(|line| !line.is_empty())
        .collect()
}

/// The command path of a line (`dead list`) and the flags it shows (`--json`); `--config` and
/// `--pipeline` with their values are global and left out of the path.
fn parse(line: &str, cli: &clap::Command) -> (Vec<String>, BTreeSet<String>) {
    let mut words = line.split_whitespace();
    assert_eq!(words.next(), Some("outbox-relay"), "{line}");
    let mut path = Vec::new();
    let mut flags = BTreeSet::new();
    let mut command = cli;
    for word in words {
        let word = word.trim_matches(|c| matches!(c, '[' | ']' | '|' | '…'));
        if let Some(flag) = word.strip_prefix("--") {
            flags.insert(flag.to_owned());
        } else if let Some(sub) = command.find_subcommand(word) {
            // Anything else is a value (`relay.toml`, `2h`, `<id>`).
            path.push(word.to_owned());
            command = sub;
        }
    }
    (path, flags)
}

/// Every leaf command's path and its long flags, globals included.
fn commands(
    command: &clap::Command,
    path: Vec<String>,
    out: &mut BTreeMap<Vec<String>, BTreeSet<String>>,
) {
    let subs: Vec<&clap::Command> = command
        .get_subcommands()
        .filter(|s| s.get_name() != "help")
        .collect();
    if subs.is_empty() {
        let flags = command
            .get_arguments()
            .filter_map(|a| a.get_long())
            .filter(|l| *l != "help")
            .map(str::to_owned)
            .collect();
        out.insert(path, flags);
        return;
    }
    for sub in subs {
        let mut path = path.clone();
        path.push(sub.get_name().to_owned());
        commands(sub, path, out);
    }
}

#[test]
fn the_readme_shows_every_command_and_flag_and_nothing_else() {
    let mut cli = Cli::command();
    cli.build();
    let mut leaves = BTreeMap::new();
    commands(&cli, Vec::new(), &mut leaves);
    let globals: BTreeSet<String> = cli
        .get_arguments()
        .filter(|a| a.is_global_set())
        .filter_map(|a| a.get_long())
        .map(str::to_owned)
        .chain(["version".to_owned()])
        .collect();

    let mut shown: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
    for line in reference() {
        let (path, flags) = parse(&line, &cli);
        if path.is_empty() {
            assert!(flags.is_subset(&globals), "{line}: {flags:?}");
            continue;
        }
        let known = leaves.get(&path).unwrap_or_else(|| {
            panic!("{line}: `{}` is no command of outbox-relay", path.join(" "))
        });
        for flag in &flags {
            assert!(
                known.contains(flag) || globals.contains(flag),
                "{line}: `{} --{flag}` is no flag of outbox-relay",
                path.join(" ")
            );
        }
        shown.entry(path).or_default().extend(flags);
    }
    for (path, flags) in &leaves {
        let shown = shown.get(path).unwrap_or_else(|| {
            panic!(
                "`outbox-relay {}` has no line in the README",
                path.join(" ")
            )
        });
        let missing: Vec<&String> = flags
            .difference(shown)
            .filter(|f| !globals.contains(*f))
            .collect();
        assert!(
            missing.is_empty(),
            "the README's line of `outbox-relay {}` does not show {missing:?}",
            path.join(" ")
        );
    }
}
