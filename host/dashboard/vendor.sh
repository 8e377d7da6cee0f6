#!/usr/bin/env sh
# Copies the browser builds the dashboard embeds from node_modules into vendor/, with their
# licences. Reproducible from package-lock.json:
#   cd host/dashboard && npm ci --ignore-scripts && ./vendor.sh
set -eu
cd "$(dirname "$0")"
m=node_modules
v=vendor
rm -rf "$v" && mkdir -p "$v/licenses"
cp "$m/graphql-ws/umd/graphql-ws.min.js" "$v/"
cp "$m/uplot/dist/uPlot.iife.min.js" "$m/uplot/dist/uPlot.min.css" "$v/"
cp "$m/react/umd/react.production.min.js" "$m/react-dom/umd/react-dom.production.min.js" "$v/"
cp "$m/graphiql/graphiql.min.js" "$m/graphiql/graphiql.min.css" "$v/"
cp "$m/graphql-ws/LICENSE.md" "$v/licenses/graphql-ws.LICENSE.md"
cp "$m/uplot/LICENSE" "$v/licenses/uplot.LICENSE"
cp "$m/react/LICENSE" "$v/licenses/react.LICENSE"
cp "$m/react-dom/LICENSE" "$v/licenses/react-dom.LICENSE"
cp "$m/graphiql/LICENSE" "$v/licenses/graphiql.LICENSE"
# Strip source-map references: the maps are not embedded.
for f in "$v"/*.js "$v"/*.css; do
    sed -i -e 's|//# sourceMappingURL=.*$||' -e 's|/\*# sourceMappingURL=.*\*/||' "$f"
done
