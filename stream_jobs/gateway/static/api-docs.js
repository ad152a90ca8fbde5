// Starts Swagger UI on the gateway's /docs page. A file of its own, not a script in the
// page: the gateway's Content-Security-Policy runs no inline script.
(function () {
  var here = document.currentScript;
  window.addEventListener("DOMContentLoaded", function () {
    window.ui = SwaggerUIBundle({
      url: here.dataset.openapiUrl,
      dom_id: "#swagger-ui",
      layout: "BaseLayout",
      deepLinking: true,
      showExtensions: true,
      showCommonExtensions: true,
      presets: [SwaggerUIBundle.presets.apis, SwaggerUIBundle.SwaggerUIStandalonePreset],
    });
  });
})();
