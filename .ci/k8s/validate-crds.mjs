// Validates the custom resources in the given YAML files (Prometheus operator, cert-manager,
// KEDA and Argo Rollouts kinds) against @kubernetes-models' schemas, which kubernetes-validate does not know, and writes
// each PrometheusRule's spec to target/ci/prometheusrules/ for `promtool check rules`.
// Usage: node validate-crds.mjs FILE...
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { basename, dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";
import * as monitoring from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import * as certManager from "@kubernetes-models/cert-manager/cert-manager.io/v1";
import * as keda from "@kubernetes-models/keda/keda.sh/v1alpha1";
import * as argo from "@kubernetes-models/argo-rollouts/argoproj.io/v1alpha1";

const models = {
  "monitoring.coreos.com/v1": monitoring,
  "cert-manager.io/v1": certManager,
  "keda.sh/v1alpha1": keda,
  "argoproj.io/v1alpha1": argo,
};
const root = resolve(dirname(fileURLToPath(import.meta.url)), "../..");
const rulesDir = join(root, "target/ci/prometheusrules");
mkdirSync(rulesDir, { recursive: true });

let checked = 0;
let failed = 0;
for (const file of process.argv.slice(2)) {
  for (const document of parseAllDocuments(readFileSync(file, "utf8"))) {
    if (document.errors.length) {
      console.error(`${file}: not valid YAML: ${document.errors[0].message}`);
      failed++;
      continue;
    }
    const object = document.toJS();
    if (!object?.apiVersion?.includes(".") || object.apiVersion.endsWith(".k8s.io/v1")) {
      continue; // a built-in kind: kubernetes-validate checks it
    }
    const what = `${file}: ${object.kind}/${object.metadata?.name}`;
    const Model = models[object.apiVersion]?.[object.kind];
    if (!Model) {
      console.error(`${what}: no schema for ${object.apiVersion} ${object.kind}`);
      failed++;
      continue;
    }
    try {
      new Model(object).validate();
      checked++;
    } catch (error) {
      console.error(`${what}: ${error.message}`);
      failed++;
    }
    if (object.kind === "PrometheusRule") {
      const out = join(rulesDir, `${basename(file, ".yaml")}-${object.metadata.name}.json`);
      writeFileSync(out, JSON.stringify(object.spec));
    }
  }
}
if (failed) {
  console.error(`custom resources: ${failed} failed`);
  process.exit(1);
}
console.log(`custom resources: ${checked} valid`);
