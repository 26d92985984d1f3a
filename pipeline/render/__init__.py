"""Low-level rendering every stage uses: markdown tables and images, report figures written as PNG."""
