// Type-checks every Grafana dashboard in dashboards/ against @grafana/schema with
// `tsc --noEmit --strict`: the dashboard as a whole against `Dashboard`, and each panel's
// options and field config against its panel plugin's generated types, so an unknown key, a
// missing required option or a wrong enum value fails. JSON is pasted in as object literals,
// which is what makes TypeScript reject unknown keys.
import { execFileSync } from "node:child_process";
import { mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const root = resolve(here, "../..");
const out = join(root, "target/ci/dashboards-ts");
mkdirSync(out, { recursive: true });

const plugin = (name, file) => `@grafana/schema/dist/esm/raw/composable/${name}/panelcfg/x/${file}_types.gen`;
const header = `import type { Dashboard, Panel, RowPanel } from "@grafana/schema";
import type { Options as TimeSeriesOptions, FieldConfig as TimeSeriesFieldConfig } from "${plugin("timeseries", "TimeSeriesPanelCfg")}";
import type { Options as StatOptions } from "${plugin("stat", "StatPanelCfg")}";
import type { Options as StateTimelineOptions, FieldConfig as StateTimelineFieldConfig } from "${plugin("statetimeline", "StateTimelinePanelCfg")}";
import type { Options as BarChartOptions, FieldConfig as BarChartFieldConfig } from "${plugin("barchart", "BarChartPanelCfg")}";

// JSON holds an enum's value, not the enum: accept exactly the values of string enums.
type Plain<T> = T extends string ? \`\${T}\` : T extends number | boolean | null | undefined ? T
  : T extends Array<infer U> ? Array<Plain<U>> : T extends object ? { [K in keyof T]: Plain<T[K]> } : T;

// What llmslo's panels send to Prometheus.
interface PromQuery {
  datasource: { type: "prometheus"; uid: string };
  refId: string;
  expr: string;
  legendFormat: string;
  range: boolean;
  instant: boolean;
  editorMode: "code" | "builder";
  format?: "time_series" | "table";
  // Grafana's Prometheus query model: also fetch the series' exemplars.
  exemplar?: boolean;
}
type Typed<O, F> = Omit<Plain<Panel<O, F>>, "targets" | "options"> & { options: Plain<O>; targets: PromQuery[] };
type TimeSeriesPanel = Typed<TimeSeriesOptions, TimeSeriesFieldConfig> & { type: "timeseries" };
type StatPanel = Typed<StatOptions, Record<string, unknown>> & { type: "stat" };
type StateTimelinePanel = Typed<StateTimelineOptions, StateTimelineFieldConfig> & { type: "state-timeline" };
type BarChartPanel = Typed<BarChartOptions, BarChartFieldConfig> & { type: "barchart" };
`;

const kinds = {
  timeseries: "TimeSeriesPanel",
  stat: "StatPanel",
  "state-timeline": "StateTimelinePanel",
  barchart: "BarChartPanel",
  row: "Plain<RowPanel>",
};
const files = [];
for (const name of readdirSync(join(root, "dashboards")).filter((f) => f.endsWith(".json")).sort()) {
  const text = readFileSync(join(root, "dashboards", name), "utf8");
  const dashboard = JSON.parse(text);
  let body = `${header}\nexport const dashboard: Plain<Dashboard> = ${text.trim()};\n`;
  for (const panel of dashboard.panels ?? []) {
    const type = kinds[panel.type];
    if (!type) {
      throw new Error(`${name}: panel "${panel.title}" has type ${panel.type}, which this check has no types for`);
    }
    body += `export const panel${panel.id}: ${type} = ${JSON.stringify(panel, null, 2)};\n`;
  }
  const file = join(out, name.replace(/\.json$/, ".ts"));
  writeFileSync(file, body);
  files.push(file);
}
writeFileSync(
  join(out, "tsconfig.json"),
  JSON.stringify({
    compilerOptions: {
      strict: true, noEmit: true, target: "es2022", module: "nodenext", moduleResolution: "nodenext",
      skipLibCheck: true, typeRoots: [], types: [], baseUrl: here, paths: { "*": [join(here, "node_modules/*")] },
    },
    files,
  }, null, 2),
);
const tsc = join(here, "node_modules/typescript/bin/tsc");
try {
  execFileSync(process.execPath, [tsc, "--noEmit", "--strict", "-p", join(out, "tsconfig.json")], { stdio: "inherit" });
} catch {
  console.error("dashboards type-check FAILED (the lines above name the file and line in target/ci/dashboards-ts)");
  process.exit(1);
}
console.log(`dashboards type-check: ${files.length} dashboards against @grafana/schema`);
