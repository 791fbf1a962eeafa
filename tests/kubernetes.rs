//! The Kubernetes manifests in `deploy/kubernetes/`: they pass the
//! Kubernetes schemas (kubernetes-validate, strict, offline) for the oldest
//! and newest versions they are meant for; their parts are wired to each
//! other (labels, ports, names); the pod's command, run as written, serves
//! probes on the admin port, refuses other host names on the public one and
//! hands out session ids that the router sends back to this pod; and the
//! router's nginx configuration, rendered as the nginx image does, passes
//! `nginx -t`. Skipped where kubernetes-validate is missing, unless
//! VRAMLAB_REQUIRE_KUBERNETES_VALIDATE is set (the test command sets it).

mod socket;

use serde_json::Value;
use std::process::Command;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use vramlab_tests::{free_port, http_get, http_get_from, root, serving, vramlab_bin};

const MANIFESTS: [&str; 2] = ["vramlab.yaml", "router.yaml"];
/// The oldest version with the pod-index label (the instance id comes from
/// it), and the newest the schemas know.
const VERSIONS: [&str; 2] = ["1.28.0", "1.37.0"];
const HOST: &str = "vramlab.example.org";

fn dir() -> std::path::PathBuf {
    root().join("deploy/kubernetes")
}

/// `python3` with the tools scripts/setup installs, or `None` (skip).
fn python() -> Option<Command> {
    let mut python = Command::new("python3");
    python.env("PYTHONPATH", root().join("tools/python"));
    let found = Command::new("python3")
        .env("PYTHONPATH", root().join("tools/python"))
        .args(["-c", "import kubernetes_validate, yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os("VRAMLAB_REQUIRE_KUBERNETES_VALIDATE").is_none(),
            "the manifests' test needs kubernetes-validate (scripts/setup --test installs it)"
        );
        eprintln!("skip: kubernetes-validate is missing");
    }
    found.then_some(python)
}

/// Every document of a manifest file, as JSON.
fn documents(python: &mut Command, file: &str) -> Vec<Value> {
    let out = python
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps(list(yaml.safe_load_all(open(sys.argv[1])))))",
        ])
        .arg(dir().join(file))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn all_documents() -> Option<Vec<Value>> {
    python()?;
    Some(
        MANIFESTS
            .iter()
            .flat_map(|f| documents(&mut python().unwrap(), f))
            .collect(),
    )
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name}"))
}

fn validate(python: &mut Command, version: &str, files: &[std::path::PathBuf]) -> (bool, String) {
    let out = python
        .args(["-m", "kubernetes_validate", "--strict", "-k", version])
        .args(files)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success() && !said.contains("ERROR"), said)
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas() {
    let Some(_) = python() else { return };
    let files: Vec<_> = MANIFESTS.iter().map(|f| dir().join(f)).collect();
    for version in VERSIONS {
        let (ok, said) = validate(&mut python().unwrap(), version, &files);
        assert!(ok, "{said}");
        assert_eq!(said.matches("passed for resource").count(), 7, "{said}");
    }
    // The check can fail: a wrong type and an unknown field are caught.
    let bad = std::env::temp_dir().join(format!("vramlab-bad-{}.yaml", std::process::id()));
    let text = std::fs::read_to_string(&files[0]).unwrap();
    for (from, to) in [
        ("replicas: 3", "replicas: three"),
        ("podManagementPolicy", "podManagement"),
    ] {
        std::fs::write(&bad, text.replace(from, to)).unwrap();
        let (ok, said) = validate(
            &mut python().unwrap(),
            VERSIONS[1],
            std::slice::from_ref(&bad),
        );
        assert!(!ok, "{to}: {said}");
    }
    std::fs::remove_file(&bad).unwrap();
}

#[test]
fn the_parts_are_wired_to_each_other() {
    let Some(docs) = all_documents() else { return };
    let set = find(&docs, "StatefulSet", "vramlab");
    let pod = &set["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(&set["spec"]["selector"]["matchLabels"], labels);
    let container = &pod["spec"]["containers"][0];
    let port = |name: &str| {
        container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap()
    };
    // Prometheus and the probes use the admin port, which is where the
    // server answers them without a token.
    let annotations = &pod["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/port"], port("admin").to_string());
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["resources"]["limits"]["nvidia.com/gpu"], "1");
    // Each pod reachable by name, also while it drains.
    let pods = find(&docs, "Service", "vramlab-pods");
    assert_eq!(set["spec"]["serviceName"], "vramlab-pods");
    assert_eq!(pods["spec"]["clusterIP"], "None");
    assert_eq!(pods["spec"]["publishNotReadyAddresses"], true);
    for service in ["vramlab", "vramlab-pods"] {
        assert_eq!(&find(&docs, "Service", service)["spec"]["selector"], labels);
    }
    // Stopping waits for the drain and the running commands' answers.
    let drain: u64 = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|a| a.as_str()?.strip_prefix("--drain-secs="))
        .unwrap()
        .parse()
        .unwrap();
    let grace = pod["spec"]["terminationGracePeriodSeconds"]
        .as_u64()
        .unwrap();
    assert!(grace >= drain + vramlab_http::http::SHUTDOWN_GRACE.as_secs());
    // The Ingress reaches the router, the router its configuration.
    let router = find(&docs, "Deployment", "vramlab-router");
    let ingress = find(&docs, "Ingress", "vramlab");
    let rule = &ingress["spec"]["rules"][0];
    assert_eq!(rule["host"], HOST);
    assert_eq!(
        rule["http"]["paths"][0]["backend"]["service"]["name"],
        "vramlab-router"
    );
    let router_pod = &router["spec"]["template"]["spec"];
    assert_eq!(
        router_pod["volumes"][0]["configMap"]["name"],
        "vramlab-router"
    );
    let kustomization = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    assert!(
        kustomization.contains("- name: vramlab-router\n    files:\n      - router.conf.template")
    );
    for file in MANIFESTS {
        assert!(kustomization.contains(&format!("  - {file}\n")), "{file}");
    }
}

/// The pod's environment as the kubelet gives it, for pod 0.
fn pod_env(container: &Value) -> Vec<(String, String)> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_string(),
                e["value"].as_str()?.to_string(),
            ))
        })
        .map(|(name, value)| (name, value.replace("$(POD_INDEX)", "0")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pods_command_serves_as_the_router_expects() {
    let Some(docs) = all_documents() else { return };
    let container =
        &find(&docs, "StatefulSet", "vramlab")["spec"]["template"]["spec"]["containers"][0];
    let (port, admin) = (free_port(), free_port());
    let args: Vec<String> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            a.as_str()
                .unwrap()
                .replace("0.0.0.0:8080", &format!("127.0.0.1:{port}"))
                .replace("0.0.0.0:9090", &format!("127.0.0.1:{admin}"))
        })
        .collect();
    let mut command = Command::new(vramlab_bin());
    command
        .arg("serve")
        .args(&args)
        .envs(pod_env(container))
        .env("VRAMLAB_DEVICE", "sim");
    let _server = serving(command);
    assert_eq!(http_get(admin, "/readyz").0, 200);
    assert_eq!(http_get(admin, "/metrics").0, 200);
    // The public port answers to the public name, not to another.
    assert_eq!(http_get_from(port, HOST, "/healthz").0, 200);
    assert_eq!(http_get_from(port, "evil.example", "/healthz").0, 403);
    let mut request = format!("ws://127.0.0.1:{port}/ws")
        .into_client_request()
        .unwrap();
    request.headers_mut().insert("host", HOST.parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(request).await.unwrap();
    let hello = socket::next(&mut ws, "hello").await;
    let session = hello["session_id"].as_str().unwrap();
    let watch = hello["watch_id"].as_str().unwrap();
    // The router's rule, `~^pod(?<ordinal>[0-9]+)-`, sends them to pod 0.
    let template = std::fs::read_to_string(dir().join("router.conf.template")).unwrap();
    assert!(template.contains("~^pod(?<ordinal>[0-9]+)- vramlab-$ordinal.vramlab-pods."));
    for id in [session, watch] {
        assert!(id.starts_with("pod0-"), "{id}");
    }
}

/// The router's configuration as the nginx image writes it (its variables
/// filled in), checked by nginx itself.
#[test]
fn the_routers_configuration_passes_nginx_t() {
    let Some(nginx) = ["/usr/sbin/nginx", "/usr/bin/nginx"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
    else {
        assert!(
            std::env::var_os("VRAMLAB_REQUIRE_NGINX").is_none(),
            "nginx is missing"
        );
        eprintln!("skip: nginx is missing");
        return;
    };
    let template = std::fs::read_to_string(dir().join("router.conf.template")).unwrap();
    let rendered = template
        .replace("${NGINX_LOCAL_RESOLVERS}", "127.0.0.1")
        .replace("${POD_NAMESPACE}", "vramlab");
    assert!(
        !rendered.contains("${"),
        "a variable the image does not fill in"
    );
    let prefix = std::env::temp_dir().join(format!("vramlab-router-{}", std::process::id()));
    std::fs::create_dir_all(&prefix).unwrap();
    std::fs::write(prefix.join("router.conf"), rendered).unwrap();
    let out = Command::new(nginx)
        .arg("-p")
        .arg(&prefix)
        .args(["-c", "router.conf", "-t", "-q", "-e", "stderr"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&prefix).unwrap();
}
