// The front end of workbench's plotly FigureWidgets (workbench/viz/widgets/figures.py).
//
// anywidget gives a model 2 s from its creation to load its module and run `initialize`; past
// that the model's `ready` promise rejects and anywidget drops every later message from the
// kernel to that model (AnyModel._handle_comm_msg awaits `ready` first). plotly's own module is
// its 5 MB widget bundle, which a busy browser cannot import within 2 s (each model imports it
// anew from a Blob URL), so a figure rendered but never took an update.
//
// This module is small: `initialize` returns at once. It imports plotly's bundle (the model's
// `_bundle` text) once per page, attaches the bundle's own model code through a thin proxy, and
// replays, with their values, the kernel's messages that arrived before it was attached; `render`
// waits for that and then draws with the bundle's own view.

const PY2JS = [
  "_py2js_addTraces",
  "_py2js_deleteTraces",
  "_py2js_moveTraces",
  "_py2js_restyle",
  "_py2js_relayout",
  "_py2js_update",
  "_py2js_animate",
  "_py2js_removeLayoutProps",
  "_py2js_removeTraceProps",
];

function bundle(model) {
  const key = "__workbench_plotly_" + model.get("_bundle_version");
  if (!globalThis[key]) {
    const url = URL.createObjectURL(new Blob([model.get("_bundle")], { type: "text/javascript" }));
    globalThis[key] = import(url).finally(() => URL.revokeObjectURL(url));
  }
  return globalThis[key];
}

export default () => {
  let attached = null; // promise of the bundle's widget object, once its model code is attached
  return {
    initialize({ model }) {
      const early = []; // [name, value] of kernel messages before the bundle's handlers exist
      const record = {};
      let live = false;
      for (const name of PY2JS) {
        record[name] = () => live || early.push([name, model.get(name)]);
        model.on("change:" + name, record[name]);
      }
      const replaying = {}; // name -> value while a recorded message is replayed
      const handlers = {}; // "change:<name>" -> the bundle's callbacks
      const proxy = {
        get: (name) => (name in replaying ? replaying[name] : model.get(name)),
        set: (name, value) => model.set(name, value),
        save_changes: () => model.save_changes(),
        send: (...args) => model.send(...args),
        on: (event, callback) => {
          (handlers[event] = handlers[event] || []).push(callback);
          model.on(event, callback);
        },
        off: (event, callback) => model.off(event, callback),
      };
      attached = bundle(model).then(async (mod) => {
        const widget = typeof mod.default === "function" ? mod.default() : mod.default;
        const init = widget.initialize({ model: proxy }); // registers the bundle's handlers
        live = true;
        for (const name of PY2JS) model.off("change:" + name, record[name]);
        for (const [name, value] of early) {
          replaying[name] = value;
          try {
            for (const callback of handlers["change:" + name] || []) callback();
          } finally {
            delete replaying[name];
          }
        }
        await init;
        return widget;
      });
    },
    async render({ model, el }) {
      const widget = await attached;
      return widget.render({ model, el });
    },
  };
};
