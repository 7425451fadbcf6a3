//! Validates the Flagger MetricTemplates in the given YAML files against Flagger's CRD schema,
//! as generated into Rust types: a missing or mistyped field fails to parse, and a field the
//! schema does not know is lost in the round trip, so it fails too.
//! Usage: validate-flagger FILE...
use kube_custom_resources_rs::flagger_app::v1beta1::metrictemplates::MetricTemplate;
use serde::Deserialize;
use serde_json::Value;
use std::process::ExitCode;

fn main() -> ExitCode {
    let mut checked = 0;
    let mut failed = 0;
    for file in std::env::args().skip(1) {
        let text = match std::fs::read_to_string(&file) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("{file}: {error}");
                failed += 1;
                continue;
            }
        };
        for document in serde_yaml::Deserializer::from_str(&text) {
            let object = match Value::deserialize(document) {
                Ok(object) => object,
                Err(error) => {
                    eprintln!("{file}: not valid YAML: {error}");
                    failed += 1;
                    continue;
                }
            };
            if !object["apiVersion"]
                .as_str()
                .is_some_and(|v| v.starts_with("flagger.app/"))
            {
                continue;
            }
            let what = format!("{file}: {}/{}", object["kind"], object["metadata"]["name"]);
            match check(&object) {
                Ok(()) => checked += 1,
                Err(error) => {
                    eprintln!("{what}: {error}");
                    failed += 1;
                }
            }
        }
    }
    if failed > 0 {
        eprintln!("Flagger resources: {failed} failed");
        return ExitCode::FAILURE;
    }
    println!("Flagger resources: {checked} valid against flagger.app/v1beta1");
    ExitCode::SUCCESS
}

/// Checks one flagger.app object: only MetricTemplates are known here.
fn check(object: &Value) -> Result<(), String> {
    if object["apiVersion"] != "flagger.app/v1beta1" || object["kind"] != "MetricTemplate" {
        return Err(format!("no schema for {} {}", object["apiVersion"], object["kind"]));
    }
    let template: MetricTemplate = serde_json::from_value(object.clone()).map_err(|error| error.to_string())?;
    let round_trip = serde_json::to_value(&template).map_err(|error| error.to_string())?;
    match first_unknown(object, &round_trip, "") {
        Some(path) => Err(format!("{path}: not a field of the schema")),
        None => Ok(()),
    }
}

/// The first path in `given` that the schema's round trip dropped or changed.
fn first_unknown(given: &Value, known: &Value, path: &str) -> Option<String> {
    match (given, known) {
        (Value::Object(given), Value::Object(known)) => given.iter().find_map(|(key, value)| {
            let path = format!("{path}.{key}");
            match known.get(key) {
                Some(known) => first_unknown(value, known, &path),
                None => Some(path),
            }
        }),
        _ if given == known => None,
        _ => Some(path.to_string()),
    }
}
